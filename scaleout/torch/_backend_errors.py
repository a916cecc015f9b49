"""Where scaleout.torch._process_group puts the classes that make a core error also torch's
DistBackendError (one per scaleout error type, made on first use), so that pickle, which torch's
futures use on a failed collective's value, finds them by name. Nothing else lives here."""
