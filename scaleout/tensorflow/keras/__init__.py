"""placeholder: being written."""
