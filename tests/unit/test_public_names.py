"""The public API is ``fednest_mpi.api``: docs/extending.md's "Public names" lists exactly its names, and
docs/api.md (signatures, generated from the code) is current."""

import re
from pathlib import Path

from fednest_mpi import api, apidoc

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _listed() -> list[str]:
    """The names of the second column of the table under "## Public names" in docs/extending.md."""
    text = (DOCS / "extending.md").read_text(encoding="utf-8").split("## Public names", 1)[1]
    rows = [line.split("|")[2] for line in text.splitlines() if line.startswith("| ") and "`" in line]
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row)]


def test_the_docs_list_exactly_the_names_the_api_exports():
    listed = _listed()
    assert len(listed) == len(set(listed))
    assert set(listed) == set(api.__all__)
    assert len(api.__all__) == len(set(api.__all__))


def test_every_exported_name_exists():
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert not missing


def test_the_reference_is_generated_from_the_code():
    assert (DOCS / "api.md").read_text(encoding="utf-8") == apidoc.markdown(), (
        "docs/api.md is stale: python -m fednest_mpi.apidoc > docs/api.md"
    )


def test_the_reference_shows_signatures_and_required_attributes():
    text = apidoc.markdown()
    assert "`load(path" in text and "Required attributes: `dim_x`, `dim_y`, `n_clients`." in text
    assert "* `step(self, k: 'int', x: 'torch.Tensor', y: 'torch.Tensor')" in text


def test_the_sections_hold_every_exported_name_once():
    assert [name for names in api.SECTIONS.values() for name in names] == api.__all__
