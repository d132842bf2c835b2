"""configs/*.yaml against the pydantic config models."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hybridmem_local.config import Config, load_config
from hybridmem_local.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _keys(data, prefix=""):
    out = set()
    for key, value in data.items():
        out.add(prefix + key)
        if isinstance(value, dict):
            out |= _keys(value, f"{prefix}{key}.")
    return out


def test_default_yaml_spells_out_exactly_the_defaults():
    path = CONFIGS / "default.yaml"
    assert load_config(path) == Config()
    # Every knob is listed in the file, so users see the whole surface in one place.
    assert _keys(yaml.safe_load(path.read_text())) == _keys(Config().model_dump(mode="json"))


def test_paper_values_are_the_defaults():
    config = Config()
    assert (config.retrieval.k, config.retrieval.tuple_multiplier) == (10, 2)
    umap, hdb = config.consolidation.umap, config.consolidation.hdbscan
    assert (umap.metric, umap.n_neighbors, umap.n_components, umap.min_dist) == ("cosine", 10, 5, 0.0)
    assert (hdb.metric, hdb.cluster_selection_method, hdb.min_cluster_size, hdb.min_samples) == (
        "euclidean",
        "eom",
        10,
        1,
    )
    assert config.consolidation.every_n_sessions == 10


def test_paper_yaml_is_the_papers_selection_and_nothing_else():
    paper, default = load_config(CONFIGS / "paper.yaml"), Config()
    retrieval = paper.retrieval
    assert (retrieval.mode, retrieval.sources, retrieval.context_budget) == ("dense", ["episodes", "tuples"], None)
    # The library default fuses memories with evidence windows into a budget instead.
    assert "windows" in default.retrieval.sources and default.retrieval.context_budget is not None
    # The paper's curation keeps every memory the LLM writes; the library's drops the other speaker's news.
    assert (paper.curation.speaker_check, default.curation.speaker_check) == (False, True)
    curation = paper.curation.model_copy(update={"speaker_check": True})
    assert paper.model_copy(update={"retrieval": default.retrieval, "curation": curation}) == default


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_validates(name):
    load_config(CONFIGS / name)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("retrieval:\n  kk: 3\n", "retrieval.kk"),
        ("retrieval:\n  k: 0\n", "retrieval.k"),
        ("llm:\n  backend: gpt5\n", "llm.backend"),
        ("consolidation:\n  hdbscan:\n    min_cluster_size: one\n", "min_cluster_size"),
        ("answering:\n  mode: yaml\n", "answering.mode"),
        ("answering:\n  evidence_turns: sometimes\n", "answering.evidence_turns"),
        ("answering:\n  cite_max_memories: 0\n", "answering.cite_max_memories"),
        ("answering:\n  cite_min_score: 1.5\n", "answering.cite_min_score"),
        ("answering:\n  evidence: true\n", "answering.evidence"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("retrieval: [\n", "cannot read config"),
    ],
)
def test_bad_config_is_an_error_naming_the_key(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert fragment in str(excinfo.value) and str(path) in str(excinfo.value)


def test_dotted_overrides():
    assert load_config(None, {"retrieval.k": 5}).retrieval.k == 5
    with pytest.raises(ConfigError, match="retrieval.nope"):
        load_config(None, {"retrieval.nope": 1})
