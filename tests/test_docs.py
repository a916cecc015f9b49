"""The documentation stays true to the code: the generated pages (configuration, Notes) match
what docs/gen/gen_pages.py makes from the code's tables now, every Note cited has exactly one
definition, the README stays short and keeps its commands, and the site builds strictly."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen_pages = _load("gen_pages", ROOT / "docs/gen/gen_pages.py")


def test_configuration_page_is_what_the_option_and_settings_tables_make():
    committed = (ROOT / "docs/configuration.md").read_text()
    assert committed == gen_pages.configuration_page(), (
        "docs/configuration.md is stale: run python docs/gen/gen_pages.py"
    )


def test_configuration_page_lists_every_option_and_setting():
    page = (ROOT / "docs/configuration.md").read_text()
    for option in gen_pages.launcher_module().OPTIONS:
        assert f"`{option.flags[0]}`" in page
    _, settings = gen_pages.core_settings()
    assert len(settings) >= 15
    for setting in settings:
        assert f"| `{setting.name}` |" in page


def test_the_settings_table_reads_the_same_from_the_header_and_the_binding():
    # Where the binding is not built the page is made from the header; both must agree.
    _binding = pytest.importorskip("scaleout._binding")
    if not hasattr(_binding, "SETTINGS"):
        pytest.skip("this build of the binding has no SETTINGS")
    assert gen_pages.settings_from_header() == tuple(
        gen_pages.CoreSetting(*row) for row in _binding.SETTINGS
    )


def test_every_variable_the_core_parses_is_on_the_configuration_page():
    # The page's core table comes from the documented Config fields (or the binding's table):
    # a setting parsed without its documenting comment would be missing from it.
    source = (ROOT / "native/common/config.cc").read_text()
    parsed = set(re.findall(r'(?:read\.\w+|Raw|Text)\("([A-Z][A-Z0-9_]+)"', source))
    if not parsed:
        pytest.skip("config.cc no longer reads settings by suffix; the binding's table rules")
    page = (ROOT / "docs/configuration.md").read_text()
    assert {s for s in parsed if f"| `SCALEOUT_{s}` |" not in page} == set()


def test_every_cited_note_has_exactly_one_definition():
    definitions, references = gen_pages.find_notes()
    defined = {}
    for note in definitions:
        defined.setdefault(note.name, []).append(f"{note.path}:{note.line}")
    twice = {name: places for name, places in defined.items() if len(places) > 1}
    assert not twice, f"Notes defined more than once: {twice}"
    undefined = {name: places for name, places in references.items() if name not in defined}
    assert not undefined, f"Notes cited but never defined: {undefined}"


def test_a_definition_is_a_title_followed_by_its_text(tmp_path):
    n = "Note"  # spelled apart, so that this file cites no Note itself
    (tmp_path / "native").mkdir()
    (tmp_path / "native" / "a.cc").write_text(
        f"// {n} [Alpha]\n// Alpha's text. More.\nint x;\n"
        f"// {n} [Alpha]\nint y;  // a bare title before code marks where Alpha applies\n"
        f"// {n} [Beta]\n// ~~~~~~~~~~~\n// Beta in c10d's form.\n"
    )
    (tmp_path / "scaleout").mkdir()
    (tmp_path / "scaleout" / "b.py").write_text(
        f'"""Module.\n\n{n} [Gamma]\nGamma in a docstring.\n"""\n# see {n} [Alpha]\n'
    )
    (tmp_path / "README.md").write_text(f"{n} [Beta] is cited here.\n")
    definitions, references = gen_pages.find_notes(tmp_path)
    assert [(d.name, d.path, d.line, d.first_sentence) for d in definitions] == [
        ("Alpha", "native/a.cc", 1, "Alpha's text."),
        ("Beta", "native/a.cc", 6, "Beta in c10d's form."),
        ("Gamma", "scaleout/b.py", 3, "Gamma in a docstring."),
    ]
    assert references == {"Alpha": ["native/a.cc:4", "scaleout/b.py:6"], "Beta": ["README.md:1"]}


def test_notes_page_indexes_every_definition():
    # Line numbers move with every edit above a Note; the site renders them afresh at build time
    # (docs/gen/hooks.py), so the committed copy is compared without them.
    def without_lines(text):
        return re.sub(r"(`[^`]+):\d+`", r"\1`", text)

    committed = (ROOT / "docs/notes.md").read_text()
    assert without_lines(committed) == without_lines(gen_pages.notes_page()), (
        "docs/notes.md is stale: run python docs/gen/gen_pages.py"
    )


def test_readme_is_short_and_keeps_its_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    # The quick start and the test command, exactly as a newcomer types them.
    assert (
        "python3 -m venv venv && . venv/bin/activate && pip install . && "
        "scaleoutrun -np 2 python examples/hello_allreduce.py"
    ) in readme
    test_command = "pytest -q -n 2 --dist loadfile tests"
    assert (
        "python3 -m venv venv && . venv/bin/activate && pip install -e '.[all]' && " + test_command
    ) in readme
    assert (ROOT / "examples/hello_allreduce.py").exists()
    ci = (ROOT / ".ci/run").read_text()
    assert "pip install -q --no-compile -e '.[all]'" in ci and test_command in ci
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_every_file_the_pages_cite_exists():
    # Modules get renamed and split; a page naming a file that is gone misleads a newcomer.
    cited = re.compile(
        r"(?<![\w/.])((?:scaleout|native|launcher|tests|examples|benchmarks|docs"
        r"|\.ci)/[\w/.\-]*\w)(?![\w*])"
    )
    pages = sorted((ROOT / "docs").glob("*.md")) + [
        ROOT / "README.md",
        ROOT / "docs/gen/configuration_intro.md",
    ]
    missing = []
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in cited.finditer(line):
                path = match.group(1)
                if not (ROOT / path).exists():
                    missing.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert not missing, "pages cite files that do not exist:\n" + "\n".join(missing)


def test_every_page_is_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+([\w-]+\.md)\s*$", config, re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert listed == pages


def test_every_plot_the_results_page_shows_is_drawn_by_the_script():
    plots = _load("plots", ROOT / "docs/gen/plots.py")
    page = (ROOT / "docs/results.md").read_text()
    shown = set(re.findall(r"\(img/([\w.-]+\.png)\)", page))
    drawn = {name for name, _ in plots.FIGURES}
    assert shown == drawn
    for name in drawn:
        assert (ROOT / "docs/img" / name).stat().st_size > 1000


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).with_name("mkdocs"))
    result = subprocess.run(
        [mkdocs, "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").exists()
