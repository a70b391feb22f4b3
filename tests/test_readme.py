"""The README says what is true: its knob table is knobs.KNOBS as `python -m cudal2.core.knobs`
writes it, every CUDAL2_* name the library accepts is in it, and its quick start installs the
way cudal2 installs today."""
import re

from cudal2.core import knobs

README = knobs.repo_root() / "README.md"


def _knob_block(text: str) -> str:
    m = re.search(r"<!-- knobs:[^\n]*-->\n(.*?)<!-- /knobs -->", text, re.S)
    assert m, "README.md has no <!-- knobs: ... --> block"
    return m.group(1)


def test_readme_knob_table_is_generated_from_the_knobs():
    assert _knob_block(README.read_text()) == knobs.markdown_table(), (
        "README.md's knob table drifted from cudal2.core.knobs.KNOBS: paste "
        "`python -m cudal2.core.knobs` between its knob markers")


def test_every_name_the_library_accepts_is_in_the_table():
    block = _knob_block(README.read_text())
    listed = set(re.findall(r"`(CUDA(?:L2)?_[A-Z_]+)`", block))
    assert set(knobs.known_names()) <= listed
    assert listed == {k.name for k in knobs.KNOBS}
    assert len(knobs.known_names()) == len(set(knobs.known_names()))


def test_the_quick_start_installs_from_a_clone_not_from_an_index_that_lacks_it():
    quick = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "pip install cudal2" not in quick
    assert 'pip install ".[build]"' in quick and "pip wheel --no-deps . -w dist" in quick
