"""Every entry of docs/troubleshooting.md that the library's messages and ``doctor`` name exists there."""
import pathlib
import re

import horovod_hetero
from horovod_hetero import errors

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCES = sorted(pathlib.Path(horovod_hetero.__file__).parent.rglob("*.py"))
#: how the code names an entry: troubleshooting("x"), a class's anchor = "x", doctor's anchor("x"),
#: and a written link troubleshooting.md#x
NAMED = [re.compile(p) for p in (r"""troubleshooting\(["']([a-z0-9-]+)["']\)""", r'\banchor = "([a-z0-9-]+)"',
                                  r'\banchor\("([a-z0-9-]+)"\)', r"troubleshooting\.md#([a-z0-9-]+)")]


def labels():
    return set(re.findall(r"^\(([a-z0-9-]+)\)=$", PAGE.read_text(), flags=re.M))


def named():
    found = {}
    for path in SOURCES:
        text = path.read_text()
        for pattern in NAMED:
            for name in pattern.findall(text):
                found.setdefault(name, path.relative_to(ROOT).as_posix())
    return found


def test_the_code_names_entries_of_the_page():
    assert len(named()) >= 30          # the patterns still find how the code names entries


def test_every_entry_the_code_names_is_on_the_troubleshooting_page():
    missing = {name: where for name, where in named().items() if name not in labels()}
    assert missing == {}


def test_every_error_class_has_its_entry():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.HeteroError)]
    assert classes and {c.__name__: c.anchor for c in classes if c.anchor not in labels()} == {}
