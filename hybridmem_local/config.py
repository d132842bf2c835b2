"""Configuration: one pydantic model per stage, the paper's values as defaults, YAML on disk.

Every model forbids unknown keys, so a typo in a YAML file is an error naming the key
instead of a silently ignored setting. ``configs/default.yaml`` spells out these defaults
with comments; a test keeps the two equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hybridmem_local.errors import ConfigError
from hybridmem_local.files.readers import read_yaml_mapping


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EmbedderConfig(_Section):
    """One embedder backend; ``backend`` picks the implementation (see hybridmem_local.embedding).

    ``sentence-transformers`` (the default) runs a model file: ``model``, ``path``, ``batch_size``
    and ``device`` are its settings. ``hashing`` needs no model file (feature hashing of words, for
    plumbing tests and tiny deployments, not for semantic recall): ``dimension`` is its setting.
    """

    backend: Literal["sentence-transformers", "hashing"] = "sentence-transformers"
    #: A name from hybridmem_local/weights/manifest.yaml; resolved to a local directory, never a hub id.
    model: str = "all-minilm-l6-v2"
    #: Explicit local directory; overrides the manifest lookup.
    path: Path | None = None
    batch_size: int = Field(default=64, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: hashing: the vector size (a sentence-transformers model has its own). 384 as MiniLM.
    dimension: int = Field(default=384, ge=16)


class IndexConfig(_Section):
    """hnswlib parameters (cosine space)."""

    M: int = Field(default=16, ge=2)
    ef_construction: int = Field(default=200, ge=1)
    #: 200, not hnswlib's usual 50: with many near-duplicate memories (an unconsolidated store)
    #: ef 50 gave recall@10 0.92 at 100k, ef 200 gave 0.99 for 0.14 ms more (docs/benchmarks.md).
    ef_search: int = Field(default=200, ge=1)
    initial_capacity: int = Field(default=1024, ge=16)
    #: Threads that insert into the graph. With 1 every build of the same rows gives the same graph,
    #: so an index caught up batch by batch and one rebuilt from SQLite answer alike, ties
    #: included; more threads build faster (20k vectors: 9.4 s on 1, 5.1 s on 2 of an idle Intel
    #: Xeon) but each build's graph, and so which of several tied memories a search returns, differs.
    build_threads: int = Field(default=1, ge=1)


class FusionWeights(_Section):
    """Per-ranking weights of reciprocal rank fusion (1 and 1: plain RRF)."""

    dense: float = Field(default=1.0, ge=0.0)
    lexical: float = Field(default=1.0, ge=0.0)


#: A store a search reads: the two curated memory stores and the raw-turn evidence windows.
SearchSource = Literal["episodes", "tuples", "windows"]
SEARCH_SOURCES: tuple[SearchSource, ...] = ("episodes", "tuples", "windows")


class RetrievalConfig(_Section):
    #: Top-k episodes and top-(tuple_multiplier * k) tuples (paper §3.3: k = 10, 2k tuples).
    k: int = Field(default=10, ge=1)
    tuple_multiplier: int = Field(default=2, ge=0)
    #: dense = the paper (§3.3); lexical = BM25 alone; hybrid = reciprocal rank fusion of both,
    #: per store. hybrid is the default, measured by scripts/bench_retrieval_budget.py on the 8
    #: LoCoMo dev conversations (1,189 questions; share with all evidence turns in a context of
    #: 512/1024/2048/4096 SmolLM2 tokens): 3-turn windows dense .49/.58/.68/.77, hybrid
    #: .62/.71/.79/.85; observation facts (curated stand-ins) dense .55/.60/.65/.69, hybrid
    #: .56/.62/.65/.69 — never worse, for ~0.3 ms more per query. `mode: dense` is the paper.
    mode: Literal["dense", "lexical", "hybrid"] = "hybrid"
    #: RRF's constant (Cormack et al. 2009).
    rrf_k: int = Field(default=60, ge=1)
    weights: FusionWeights = Field(default_factory=FusionWeights)
    #: The stores searched: curated memories and raw-turn evidence windows, fused in one
    #: ranking by default (see context_budget). configs/paper.yaml is the paper's selection.
    sources: list[SearchSource] = Field(default_factory=lambda: list(SEARCH_SOURCES), min_length=1)
    #: Evidence windows: turns per window and turns between window starts (within one session).
    window_size: int = Field(default=3, ge=1)
    window_stride: int = Field(default=1, ge=1)
    #: How deep each ranking goes before fusion, and the candidate pool of budget mode.
    candidate_depth: int = Field(default=100, ge=1)
    #: Tokens of the answer model's tokenizer to fill with context, in fused rank order across
    #: sources (plain RRF, a turn paid once); None keeps the paper's fixed k / 2k selection.
    #: Default from scripts/bench_retrieval_budget.py --selections (8 LoCoMo dev conversations,
    #: 1,189 questions, observation facts standing in for curated memories; share of questions
    #: with all evidence turns shown at 512/1024/2048/4096 tokens): memories only
    #: .56/.62/.65/.69, windows only .62/.71/.79/.85, fused .69/.75/.83/.88; the paper's
    #: selection .53 (367 tokens). Window weights 0.8/1.25 were no better than plain RRF.
    #: 2048 leaves SmolLM2's 4096-token window room for the prompt and the reply.
    context_budget: int | None = Field(default=2048, ge=1)

    @model_validator(mode="after")
    def _check_windows(self) -> RetrievalConfig:
        if len(set(self.sources)) != len(self.sources):
            raise ValueError(f"retrieval.sources lists a store twice: {self.sources}")
        if self.window_stride > self.window_size:
            raise ValueError(
                f"retrieval.window_stride ({self.window_stride}) is larger than window_size ({self.window_size}): "
                "turns between windows would never be searched"
            )
        return self


class LLMConfig(_Section):
    """One structured-LLM backend; ``backend`` picks the implementation (see hybridmem_local.llm)."""

    backend: Literal["llamacpp", "transformers", "vllm-offline", "openai-server"] = "llamacpp"
    #: A name from hybridmem_local/weights/manifest.yaml (local backends) or the served model name (server). The
    #: default is the smallest embedded model that answered both demo questions right
    #: (Qwen2.5-Coder-0.5B did not; SmolLM2-135M neither): docs/benchmarks.md §12.
    model: str = "qwen2.5-coder-1.5b-instruct"
    path: Path | None = None
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int = 0
    #: The most a reply may take; curation sizes each window's reply below it
    #: (CurationConfig.reply sizing) and sizes its windows to leave this much room.
    max_new_tokens: int = Field(default=2048, ge=1)
    #: Context window the prompts are sized for (sessions longer than this are split).
    context_tokens: int = Field(default=4096, ge=256)
    #: llama.cpp threads for decoding (null: every core).
    n_threads: int | None = None
    #: llama.cpp threads for reading prompts (null: as n_threads). Set both to 1 beside another job.
    n_threads_batch: int | None = Field(default=None, ge=1)
    #: llama.cpp: keep each sequence's KV cache between calls and reuse the longest prompt prefix
    #: held (the fixed instructions are read once, not once per window). Greedy replies are the same.
    keep_prefix: bool = True
    #: llama.cpp: feed the tokens the JSON grammar forces (keys, quotes, braces) in one step
    #: instead of one decode step each.
    jump_forward: bool = True
    #: llama.cpp: tokens guessed per step by prompt lookup (copied from where the reply's last
    #: tokens occurred before) and checked in the same step; 0 = none. Greedy decoding only.
    draft_tokens: int = Field(default=0, ge=0, le=16)
    # vLLM (in-process or server side)
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    max_model_len: int | None = None
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    #: vLLM reasoning parser (e.g. "qwen3"): with it, constrained JSON starts after the <think> block.
    reasoning_parser: str | None = None
    #: vLLM weights dtype ("auto", "bfloat16", "float16", "float32"; vLLM rejects "bf16").
    dtype: str = "auto"
    #: vLLM eager mode (no torch.compile / CUDA graphs); null = vLLM's default (off). On the CPU
    #: build, true starts the engine in ~30 s instead of ~90 s.
    enforce_eager: bool | None = None
    #: Sequences decoded at once: vLLM's max_num_seqs (null: vLLM's default); llama.cpp's
    #: sequences in one context (null: 4; each holds context_tokens of KV cache).
    max_num_seqs: int | None = Field(default=None, ge=1)
    #: vLLM CPU build only: GiB of RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE); null = vLLM's default.
    cpu_kvcache_space_gib: float | None = Field(default=None, gt=0)
    #: vLLM: constrained JSON without free whitespace (engine-wide structured_outputs_config;
    #: vLLM 0.32 ignores the per-request flag). Off by default: forced compact JSON made SmolLM2
    #: curate 3 LoCoMo sessions in > 650 s (replies looping to max_new_tokens) against 104 s with
    #: free whitespace; on, it stops a small model spending max_new_tokens on newlines.
    compact_json: bool = False
    # OpenAI-compatible server
    base_url: str | None = None
    api_key_env: str = "HYBRIDMEM_API_KEY"
    timeout_s: float = Field(default=120.0, gt=0)
    #: Requests in flight at once; the server batches them, so this is the batch size it sees.
    max_concurrent_requests: int = Field(default=32, ge=1)
    #: Qwen3 thinking mode; off for curation JSON, switchable for answering.
    enable_thinking: bool = False
    #: Bounded retries when a reply fails schema validation (backends that cannot constrain).
    max_retries: int = Field(default=2, ge=0)


class CurationConfig(_Section):
    #: "sync" curates inside add_session; "queue" stores the raw session and defers curation.
    mode: Literal["sync", "queue"] = "sync"
    #: The prompt (hybridmem_local/prompts/<name>.yaml), one reply schema for both. curation_small
    #: teaches the form by one worked example, for the embedded models (docs/benchmarks.md §12);
    #: curation is the paper's appendix prompt, field by field (the vLLM configs).
    prompt: Literal["curation", "curation_small"] = "curation_small"
    #: Annotate relative dates ("yesterday") with their absolute date before the LLM sees them.
    annotate_relative_dates: bool = True
    #: Sessions curated per batched LLM call (vLLM batches them; progress updates per batch).
    batch_sessions: int = Field(default=8, ge=1)
    #: Extra batched rounds for windows whose reply failed: each is re-sent split in half
    #: (a shorter window fits the context and its reply fits max_new_tokens).
    retry_rounds: int = Field(default=1, ge=0)
    #: Most episodes / tuples one window's reply may hold (a JSON-schema maxItems): constrained
    #: small models otherwise repeat list items until max_new_tokens. Raise them for models with
    #: large windows (vLLM); the grammar engines' cost does not grow with them.
    max_episodes_per_window: int = Field(default=3, ge=1)
    max_tuples_per_window: int = Field(default=6, ge=1)
    #: A window's reply is sized to the window: at most one episode per ``turns_per_episode``
    #: turns and ``tuples_per_turn`` tuples a turn (within the two caps above), and a reply
    #: budget of those items at ``episode_reply_tokens`` / ``tuple_reply_tokens`` each (within
    #: llm.max_new_tokens): a one-turn session gets one episode, two tuples and ~450 tokens,
    #: not 2,048 for a small model to fill.
    #: A curated memory is left out when more than this share of its distinct word stems (an
    #: episode's details; a tuple's entity and object) occur nowhere in its window: small models
    #: copy the prompt's worked example or invent (Qwen2.5-Coder-0.5B wrote "Bob is back from
    #: Lisbon, ... 9 hours" from the example into a session about a 10K race). 1.0 turns it off.
    max_ungrounded_share: float = Field(default=0.5, ge=0.0, le=1.0)
    #: A curated memory about one speaker is left out when the turns of its session that state
    #: it are the other speaker's own news ("I got the internship!" said by Gina, stored as Jon's;
    #: text/attribution.py ``misattributed``). The 1.5B's commonest error (docs/benchmarks.md
    #: §15): on 100 memories read by hand it catches 21 of the 33 given to the wrong speaker and
    #: none of the 33 right ones (the sample it was chosen on); on LoCoMo's gold facts of the 7
    #: other dev conversations it drops 6.4% of right facts and catches 76% handed to the other
    #: speaker (scripts/measure_speaker_check.py).
    speaker_check: bool = True
    turns_per_episode: int = Field(default=3, ge=1)
    tuples_per_turn: float = Field(default=1.0, gt=0)
    episode_reply_tokens: int = Field(default=200, ge=16)
    tuple_reply_tokens: int = Field(default=110, ge=16)
    #: Provenance alignment (text/alignment.py) of a memory left without a valid cited turn id: the
    #: best-scoring turn of its window, then more while their score reaches align_min_score, at
    #: most align_max_turns; score = align_lexical_weight * stem overlap + the rest * cosine.
    #: Measured by scripts/bench_alignment.py (1,995 LoCoMo observation facts of the 8 dev
    #: conversations aligned to their session without their evidence ids): lexical weight 0.75
    #: beats cosine alone (top-1 precision .825 vs .649) and stems alone (.812); top-1 alone
    #: gives P .825 / R .819; a 2nd-3rd turn at >= 0.6 gives P .800 / R .829 (1.04 turns per
    #: fact), while 0.5 lets in wrong turns (P .698 / R .859). Gold facts cite ~1 turn; a curated
    #: episode often spans a question and its answer, hence up to 3 turns when they score high.
    align_max_turns: int = Field(default=3, ge=1)
    align_min_score: float = Field(default=0.6, ge=0.0, le=1.0)
    align_lexical_weight: float = Field(default=0.75, ge=0.0, le=1.0)
    #: Write-time duplicate guard (curation/dedup.py): a curated memory whose index text has at least this
    #: cosine with an active memory of the same kind and timestamp or session, and the same
    #: numbers, is not stored again (an exact repeat never is). scripts/bench_duplicates.py on
    #: the 8 LoCoMo dev conversations: of 9,151 pairs of different observation facts of one
    #: session, 3 reach 0.95, each the same event told from both speakers' sides; 0.92 merges 7,
    #: 0.90 21 (there different facts start to merge: "Melanie's son got into an accident" into
    #: "Melanie went on a road trip ... an accident", 0.912). At 0.95 verbatim repeats (what
    #: SmolLM2 writes) and a third of facts cut before their last clause are caught; rewordings by
    #: another writer mostly are not (2% of LoCoMo's event summaries): consolidation merges those.
    duplicate_cosine: float = Field(default=0.95, ge=0.0, le=1.0)
    #: Forget requests in a session ("please forget my SSN"; curation/redaction.py): found by the
    #: rules (forget_rules.yaml) and, with rules+llm, also where curation's LLM marks one; what
    #: they name is redacted from the namespace's turns and memories, undoable until confirmed.
    forget_requests: Literal["off", "rules", "rules+llm"] = "rules+llm"
    #: Days a redaction stays undoable; then the next curation confirms it (the removed text is
    #: deleted for good). null: only an admin confirms.
    redaction_review_days: float | None = Field(default=7.0, ge=0.0)


class AnsweringConfig(_Section):
    """How the answer model is asked (answering/answerer.py) and what its context shows (answering/context.py)."""

    #: json: constrained JSON {answer, cited_memory_ids}; text: a short plain-text answer, the
    #: cited memories derived by aligning question + answer to the memories shown (text/alignment.py).
    #: text is the default because the default LLM is SmolLM2-135M: scripts/bench_answer_modes.py
    #: (40 LoCoMo dev questions, observation facts + raw turns, 2,048 tokens; docs/benchmarks.md
    #: §11) gave it F1 .087 in text vs .031 in JSON and cited recall .43 vs .15 (under the schema
    #: it cites "E1", the prompt's example, in 78 of 80 answers). Models that follow the schema
    #: keep json (the vLLM configs; not measured here).
    mode: Literal["json", "text"] = "text"
    #: Each memory in the context brings its source turns as raw text, paid from the same budget
    #: (a turn a window already shows is shown and paid once). On: same bench, SmolLM2's F1 text
    #: .087 -> .104, JSON .031 -> .040, all gold evidence shown as raw text .60 -> .65 of questions,
    #: for ~5 fewer memories in the same tokens (provenance recall .725 -> .675).
    evidence_turns: bool = True
    #: Text mode's citations: the best-aligned memory shown, then more scoring at least
    #: cite_min_score, at most cite_max_memories; the score weights as curation's alignment
    #: (stem overlap 0.75, cosine 0.25: CurationConfig.align_lexical_weight's measurement).
    cite_max_memories: int = Field(default=3, ge=1)
    cite_min_score: float = Field(default=0.6, ge=0.0, le=1.0)
    cite_lexical_weight: float = Field(default=0.75, ge=0.0, le=1.0)


class UMAPConfig(_Section):
    """Paper appendix C."""

    metric: str = "cosine"
    n_neighbors: int = Field(default=10, ge=2)
    n_components: int = Field(default=5, ge=1)
    min_dist: float = Field(default=0.0, ge=0.0)
    random_state: int = 42


class HDBSCANConfig(_Section):
    """Paper appendix C."""

    metric: str = "euclidean"
    cluster_selection_method: Literal["eom", "leaf"] = "eom"
    min_cluster_size: int = Field(default=10, ge=2)
    min_samples: int = Field(default=1, ge=1)


class ConsolidationConfig(_Section):
    #: "auto" uses cuML when it imports and a CUDA device is visible, else the CPU libraries.
    backend: Literal["auto", "cpu", "gpu"] = "auto"
    #: Run automatically after this many newly ingested sessions (paper: every 10-20); 0 = never.
    every_n_sessions: int = Field(default=10, ge=0)
    umap: UMAPConfig = Field(default_factory=UMAPConfig)
    hdbscan: HDBSCANConfig = Field(default_factory=HDBSCANConfig)


#: The URL schemes of a PostgreSQL store (``storage/backends.py``); psycopg 3 is the driver.
POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg", "postgres")


def is_postgres_url(location: object) -> bool:
    """Whether a store location is a PostgreSQL URL rather than a SQLite path."""
    return isinstance(location, str) and location.split("://", 1)[0] in POSTGRES_SCHEMES and "://" in location


class StoreConfig(_Section):
    #: How long a writer waits for another process's transaction before giving up.
    busy_timeout_ms: int = Field(default=30_000, ge=0)
    #: ``sqlcipher``: the database, its LLM call cache, index files and exports are encrypted at
    #: rest under one master key (docs/deployment.md). ``none`` keeps the zero-setup default.
    encryption: Literal["none", "sqlcipher"] = "none"
    #: A file holding the master key (32 raw bytes, 64 hex digits or base64), readable by its
    #: owner only. Never the key itself: configs are copied and committed. A systemd credential
    #: (``$CREDENTIALS_DIRECTORY/hybridmem-master-key``) comes first, ``$HYBRIDMEM_MASTER_KEY`` last.
    key_file: Path | None = None
    #: ``postgresql://user@host:5432/db``: the store lives in PostgreSQL, shared by several
    #: ``hybridmem serve`` replicas and workers (docs/deployment.md); None: the SQLite file given
    #: by ``--db``. Give the password through ``PGPASSWORD`` or ``~/.pgpass``, never in a config.
    url: str | None = None
    #: Where a PostgreSQL store's index files and LLM call cache live on this host (they are
    #: caches, rebuilt from the database); None: ``~/.cache/hybridmem/postgres/<host>-<port>-<db>-<hash>``.
    local_dir: Path | None = None

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        if url is not None and not is_postgres_url(url):
            raise ValueError(
                f"store.url must be a postgresql:// (or postgresql+psycopg://) URL, got {url.split('://')[0]!r}:// "
                "(a SQLite store is given by its path, --db)"
            )
        return url


class AuditConfig(_Section):
    """The audit trail (storage/audit.py): who read or changed what, ids only, as a hash chain."""

    #: Record every operation of the Python API, the CLI and the service.
    enabled: bool = True
    #: ``hybridmem audit trim`` removes entries older than this many days (None: keep them all).
    retention_days: int | None = Field(default=None, ge=1)


class ServiceConfig(_Section):
    """``hybridmem serve``: the HTTP and MCP service over one store, and its curation worker."""

    #: Loopback by default; any other address must be asked for explicitly.
    host: str = "127.0.0.1"
    port: int = Field(default=8420, ge=1, le=65535)
    #: Request bodies larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    #: Per-key token bucket: sustained requests per second and the burst allowed above it.
    rate_limit_per_s: float = Field(default=20.0, gt=0)
    rate_limit_burst: int = Field(default=40, ge=1)
    #: Sessions stored but not yet curated, over all namespaces; past it adding answers 503.
    max_pending_sessions: int = Field(default=1000, ge=1)
    #: An ``ask`` that has no answer after this long answers 504 (the LLM may be busy curating).
    ask_timeout_s: float = Field(default=120.0, gt=0)
    #: How often the worker looks for pending sessions when nobody woke it.
    worker_poll_s: float = Field(default=2.0, gt=0)
    #: A worker's claim on the sessions of its batch lasts this long and is renewed every third
    #: of it while the batch runs; a worker that dies loses its claim when it runs out, and
    #: another worker curates those sessions (service/worker.py).
    claim_lease_s: float = Field(default=60.0, gt=0)
    #: Log request bodies (turn text, queries) for debugging; keys are never logged.
    log_content: bool = False


class Config(_Section):
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    #: The evaluation judge; defaults to the system's own LLM when unset.
    judge: LLMConfig | None = None
    curation: CurationConfig = Field(default_factory=CurationConfig)
    answering: AnsweringConfig = Field(default_factory=AnsweringConfig)
    consolidation: ConsolidationConfig = Field(default_factory=ConsolidationConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    service: ServiceConfig = Field(default_factory=ServiceConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> Config:
    """Load a YAML config (or the defaults when ``path`` is None) and apply dotted overrides.

    ``overrides`` maps dotted keys to values, e.g. ``{"retrieval.k": 5}``.
    """
    data: dict = {}
    if path is not None:
        path = Path(path)
        data = read_yaml_mapping(path, "config", ConfigError, allow_empty=True)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
        node[leaf] = value
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        where = f"config {path}" if path is not None else "config"
        raise ConfigError(f"{where} is invalid:\n{exc}") from exc
