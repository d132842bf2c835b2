"""Several replies decoded at once through one llama.cpp context (llama-cpp-python's low-level API).

llama.cpp computes a step for many sequences in one ``llama_decode``: on a CPU a step costs
little more for four sequences than for one (the weights are read once per step), so a batch
of curation windows or questions finishes in a fraction of the time of one-at-a-time calls.

Three levers, each switchable for the benchmark (``scripts/bench_llm_throughput.py``):

- **Prefixes kept** (``keep_prefix``): each sequence's KV cells stay after its reply, and a new
  prompt reuses the longest prefix any sequence holds (copied from another sequence's stream
  when that one holds more), so the ~750 tokens of fixed instructions are read once, not once per window.
  Prompts are admitted in sorted order so those sharing a prefix follow each other, and a
  prompt waits one step rather than re-read a prefix another sequence is reading right now.
- **Sequences at once** (``sequences``): the context holds that many; prompts fill free ones
  as replies finish (continuous batching), prefill and decode in the same step.
- **Jump-forward** (``jump_forward``): after each sampled token, the tokens the JSON grammar
  forces (keys, quotes, braces) are fed in the next step with it instead of one step each.
- **Prompt-lookup drafts** (``draft_tokens``, greedy only): after the tokens known, a few
  guesses copied from where the reply's last tokens occurred before are fed in the same step;
  the logits show which the model would have written, those are kept, the rest dropped.

Each sequence has its own llguidance matcher, so each reply is constrained by its own schema.
Greedy replies are the same whatever the levers as long as llama.cpp computes a token's row
with the same bits in any batch: true of SmolLM2's kernels (tests/llm/test_llamacpp.py), not of
the repacked Q4_K kernels of the Qwen2.5-Coder models, where the batch's shape (its rows, how
they split between threads) changes a row's last bits and a near-tie can then go the other way.
Their replies differ now and then, as every batching engine's do; docs/benchmarks.md §14
measures whether the memories are as good.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from hybridmem_local.errors import LLMError

if TYPE_CHECKING:  # llama_cpp loads its shared library at import: only when a decoder is built
    from llguidance import LLMatcher

#: Why a reply ended: the model (or its grammar) ended it; the token budget or the context
#: window ran out; the repetition guard stopped a loop; the prompt did not fit.
Finish = Literal["stop", "length", "looped", "error"]


def loop_period(tokens: Sequence[int], max_period: int = 64, min_span: int = 48) -> int | None:
    """The period ``p`` of a cycle that fills the tail of ``tokens``, or None.

    A tail counts as a loop when its last ``max(2p, min_span)`` tokens equal the ``p`` tokens
    before each of them (so the cycle ran at least three times, and ``min_span`` tokens at
    the very least): real memories do not say the same 16 words three times in a row.
    """
    n = len(tokens)
    for period in range(1, max_period + 1):
        span = max(2 * period, min_span)
        if n < span + period or tokens[-1] != tokens[-1 - period]:
            continue
        if list(tokens[n - span :]) == list(tokens[n - span - period : n - period]):
            return period
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class DecoderSettings:
    #: Tokens one sequence may hold: its prompt and its reply.
    context_tokens: int
    #: Sequences decoded at once (the KV cache holds ``context_tokens`` for each).
    sequences: int = 4
    n_threads: int = 1
    #: Threads for prompt processing (llama.cpp's n_threads_batch).
    n_threads_batch: int = 1
    #: Tokens per ``llama_decode`` (prompt chunks and decode steps together).
    batch_tokens: int = 512
    keep_prefix: bool = True
    jump_forward: bool = True
    #: Tokens guessed by prompt lookup and checked in the same step (0: none). Greedy only.
    draft_tokens: int = 0
    #: 0 = greedy; above, plain temperature sampling seeded per reply.
    temperature: float = 0.0
    seed: int = 0


@dataclass
class DecodeJob:
    """One reply to generate, and what came of it."""

    prompt: list[int]
    max_new_tokens: int
    #: A fresh llguidance matcher when the reply is constrained; None for free text.
    matcher: LLMatcher | None = None
    tokens: list[int] = field(default_factory=list)
    finish: Finish = "stop"
    error: str | None = None
    latency_s: float = 0.0


@dataclass
class DecoderStats:
    """What the decoder did since it was built (for the benchmark and the tests)."""

    steps: int = 0
    prompt_tokens_read: int = 0
    prompt_tokens_reused: int = 0
    sampled_tokens: int = 0
    forced_tokens: int = 0
    #: Guessed tokens fed (prompt lookup), and those the model confirmed.
    draft_tokens: int = 0
    draft_accepted: int = 0


@dataclass
class _Running:
    job: DecodeJob
    seq: int
    #: Tokens to feed at the next steps (the prompt's unread part, then sampled + forced tokens,
    #: then the guesses of ``draft``).
    pending: list[int]
    rng: np.random.Generator
    started: float
    #: The guesses at the end of ``pending``: fed to be checked, not yet part of the reply.
    draft: list[int] = field(default_factory=list)


class LlamaBatchDecoder:
    """A GGUF model and one llama.cpp context holding ``settings.sequences`` sequences.

    One caller at a time: ``run`` owns the context while it decodes.
    """

    def __init__(self, gguf: Path, settings: DecoderSettings):
        import llama_cpp

        self._lc = llama_cpp
        self.settings = settings
        self.stats = DecoderStats()
        llama_cpp.llama_backend_init()
        if logging.getLogger("llama-cpp-python").level == logging.NOTSET:
            # llama.cpp logs every load detail at INFO through this logger: errors only, unless set.
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        self._model = llama_cpp.llama_model_load_from_file(str(gguf).encode(), llama_cpp.llama_model_default_params())
        if not self._model:
            raise LLMError(f"llama.cpp could not load {gguf}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = settings.context_tokens * settings.sequences  # split evenly between the streams
        params.n_batch = params.n_ubatch = settings.batch_tokens
        params.n_seq_max = settings.sequences
        params.n_threads = settings.n_threads
        params.n_threads_batch = settings.n_threads_batch
        # One KV stream per sequence: each attends over its own cells only, so a reply does not
        # depend on what else is in the batch (with one unified stream, greedy replies changed
        # with the batch's company). A prefix is then copied between streams, not shared.
        params.kv_unified = False
        params.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise LLMError(f"llama.cpp could not create a context of {params.n_ctx} tokens for {gguf}")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(settings.batch_tokens, 0, 1)
        #: The tokens each sequence's KV cells hold, in order from position 0.
        self._held: list[list[int]] = [[] for _ in range(settings.sequences)]

    # -- the model's vocabulary -------------------------------------------------------------

    @property
    def vocab(self):
        """The llama.cpp vocab pointer (llguidance builds its tokenizer from it)."""
        return self._vocab

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 16
        while True:
            buffer = (self._lc.llama_token * size)()
            n = self._lc.llama_tokenize(self._vocab, data, len(data), buffer, size, add_special, True)
            if n >= 0:
                return list(buffer[:n])
            size = -n

    def detokenize(self, tokens: Sequence[int]) -> str:
        out = bytearray()
        buffer = ctypes.create_string_buffer(256)
        for token in tokens:
            n = self._lc.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, False)
            out += buffer.raw[:n]
        return out.decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """A token's text, special tokens included (for chat templates' bos/eos)."""
        if token < 0:
            return ""
        buffer = ctypes.create_string_buffer(256)
        n = self._lc.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, True)
        return buffer.raw[:n].decode("utf-8", errors="replace")

    @property
    def eos_token(self) -> int:
        return self._lc.llama_vocab_eos(self._vocab)

    @property
    def bos_token(self) -> int:
        return self._lc.llama_vocab_bos(self._vocab)

    def chat_template(self) -> str | None:
        template = self._lc.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    # -- decoding ---------------------------------------------------------------------------

    def run(self, jobs: Sequence[DecodeJob]) -> None:
        """Generate every job's reply (filled into the job)."""
        start = time.perf_counter()
        queue: deque[DecodeJob] = deque()
        for job in sorted(jobs, key=lambda j: j.prompt):  # shared prefixes follow each other
            if len(job.prompt) >= self.settings.context_tokens:
                job.finish, job.error = (
                    "error",
                    (
                        f"the prompt's {len(job.prompt)} tokens exceed the context window of "
                        f"{self.settings.context_tokens} tokens"
                    ),
                )
            elif job.max_new_tokens < 1:
                job.finish = "length"
            else:
                queue.append(job)
        running: dict[int, _Running] = {}
        while queue or running:
            self._admit(queue, running, start)
            self._step(running)

    def _admit(self, queue: deque[DecodeJob], running: dict[int, _Running], started: float) -> None:
        """Put queued jobs into free sequences, each reusing the longest prefix held."""
        free = [seq for seq in range(self.settings.sequences) if seq not in running]
        while queue and free:
            job = queue[0]
            # Never the whole prompt: its last token must be decoded to give the first logits.
            limit = len(job.prompt) - 1
            shared = [min(common_prefix(job.prompt, held), limit) for held in self._held]
            if not self.settings.keep_prefix:
                shared = [0] * len(shared)
            best = max(shared)
            reading = [
                common_prefix(job.prompt, r.job.prompt)
                for r in running.values()
                if len(self._held[r.seq]) < len(r.job.prompt)
            ]
            if self.settings.keep_prefix and reading and max(reading) > best + 64:
                return  # another sequence is reading this prefix now: wait a step and copy it
            queue.popleft()
            seq = max(free, key=lambda s: shared[s])
            free.remove(seq)
            source = shared.index(best)
            if best > shared[seq]:
                self._lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
                # Between streams llama.cpp copies whole sequences: copy, then cut after the prefix.
                self._lc.llama_memory_seq_cp(self._memory, source, seq, -1, -1)
                self._lc.llama_memory_seq_rm(self._memory, seq, best, -1)
            else:
                self._lc.llama_memory_seq_rm(self._memory, seq, best, -1)
            self._held[seq] = list(job.prompt[:best])
            self.stats.prompt_tokens_reused += best
            rng = np.random.default_rng(self.settings.seed)
            running[seq] = _Running(job, seq, list(job.prompt[best:]), rng, started)

    def _step(self, running: dict[int, _Running]) -> None:
        """One ``llama_decode`` over every running sequence; then each picks its next tokens."""
        batch = self._batch
        budget = self.settings.batch_tokens
        n = 0
        fed: list[tuple[_Running, int, int | None]] = []  # (sequence, tokens fed, its first logits row)
        # Decoding sequences first (a few tokens each), then prompt chunks fill the rest.
        for run in sorted(running.values(), key=lambda r: len(r.pending)):
            if run.draft and len(run.pending) > budget - n:  # no room for the guesses this step
                del run.pending[len(run.pending) - len(run.draft) :]
                run.draft = []
            take = min(len(run.pending), budget - n)
            if take <= 0:
                continue
            position = len(self._held[run.seq])
            # The last token known and each guess after it give logits: the next token after each.
            first_row = n + take - 1 - len(run.draft) if take == len(run.pending) else None
            for i in range(take):
                batch.token[n + i] = run.pending[i]
                batch.pos[n + i] = position + i
                batch.n_seq_id[n + i] = 1
                batch.seq_id[n + i][0] = run.seq
                batch.logits[n + i] = first_row is not None and n + i >= first_row
            fed.append((run, take, first_row))
            n += take
        batch.n_tokens = n
        status = self._lc.llama_decode(self._ctx, batch)
        if status != 0:
            raise LLMError(f"llama_decode failed with status {status} on a batch of {n} tokens")
        self.stats.steps += 1
        for run, take, first_row in fed:
            held = self._held[run.seq]
            self.stats.prompt_tokens_read += max(0, min(take, len(run.job.prompt) - len(held)))
            held.extend(run.pending[:take])
            del run.pending[:take]
            if first_row is not None and self._verify(run, first_row):
                self._finish(run, running)

    def _logits(self, row: int) -> np.ndarray:
        return np.ctypeslib.as_array(self._lc.llama_get_logits_ith(self._ctx, row), shape=(self.n_vocab,))

    def _verify(self, run: _Running, first_row: int) -> bool:
        """Take ``run``'s next tokens from the logits of its last step: the token after the last
        one known, then, while the guesses fed after it turn out right, the token after each.
        Guesses that were wrong leave the KV cache. True when the reply is over."""
        draft, run.draft = run.draft, []
        checked = 0  # guesses confirmed so far
        while True:
            truth = self._next_tokens(run, self._logits(first_row + checked))
            if truth is None:
                over = True
                kept = checked
                break
            matched = common_prefix(truth, draft[checked:])
            self.stats.draft_accepted += matched
            if matched < len(truth):  # a guess was wrong (or none left): feed the truth from there
                over = False
                kept = checked + matched
                run.pending = truth[matched:]
                break
            checked += matched
        if kept < len(draft):
            held = self._held[run.seq]
            del held[len(held) - (len(draft) - kept) :]
            self._lc.llama_memory_seq_rm(self._memory, run.seq, len(held), -1)
        if not over and self.settings.draft_tokens and self.settings.temperature <= 0:
            run.draft = self._draft(run)
            run.pending += run.draft
            self.stats.draft_tokens += len(run.draft)
        return over

    def _next_tokens(self, run: _Running, logits: np.ndarray) -> list[int] | None:
        """The next tokens of ``run``'s reply (added to it): one chosen from ``logits``, then any
        the grammar forces. None when the reply is over instead."""
        job = run.job
        if loop_period(job.tokens) is not None:
            job.finish = "looped"
            return None
        allowed = None
        if job.matcher is not None:
            allowed = np.unpackbits(np.frombuffer(job.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
            allowed = allowed[: self.n_vocab].astype(bool)
            if job.matcher.is_error() or not allowed.any():
                job.finish, job.error = "error", f"the JSON constraint failed: {job.matcher.get_error()}"
                return None
        token = self._pick(logits, allowed, run.rng)
        if self._lc.llama_vocab_is_eog(self._vocab, token):
            return None
        job.tokens.append(token)
        self.stats.sampled_tokens += 1
        forced: list[int] = []
        if job.matcher is not None:
            job.matcher.consume_token(token)
            if self.settings.jump_forward and not job.matcher.is_stopped():
                forced = job.matcher.compute_ff_tokens()[: self._room(job)]
                if forced:
                    job.matcher.consume_tokens(forced)
                    job.tokens.extend(forced)
                    self.stats.forced_tokens += len(forced)
            if job.matcher.is_stopped():  # the grammar allows only the end now: no step for it
                return None
        if self._room(job) <= 0:
            job.finish = "length"
            return None
        return [token, *forced]

    def _draft(self, run: _Running) -> list[int]:
        """Guesses for the tokens after ``run``'s reply so far (prompt lookup): what followed the
        latest earlier occurrence of its last tokens in the prompt or the reply. Curation copies
        names, dates and numbers from the turns, so such guesses are often right, and a step
        that checks a few guesses costs little more than one that does not."""
        job = run.job
        context = np.asarray(job.prompt + job.tokens)
        limit = min(self.settings.draft_tokens, self._room(job))
        for size in (3, 2):
            if len(context) <= size or limit <= 0:
                continue
            tail = context[-size:]
            starts = np.flatnonzero(context[:-size] == tail[0])
            for start in starts[::-1]:
                if np.array_equal(context[start : start + size], tail):
                    guess = context[start + size : start + size + limit].tolist()
                    if job.matcher is not None:  # only what the grammar would accept
                        guess = guess[: job.matcher.validate_tokens(guess)]
                    return guess
        return []

    def _room(self, job: DecodeJob) -> int:
        """Tokens ``job``'s reply may still add: within its budget and the context window."""
        return min(job.max_new_tokens, self.settings.context_tokens - len(job.prompt)) - len(job.tokens)

    def _pick(self, logits: np.ndarray, allowed: np.ndarray | None, rng: np.random.Generator) -> int:
        scores = logits if allowed is None else np.where(allowed, logits, -np.inf)
        if self.settings.temperature <= 0:
            return int(np.argmax(scores))
        scaled = (scores - scores.max()) / self.settings.temperature
        weights = np.exp(scaled)
        return int(rng.choice(len(weights), p=weights / weights.sum()))

    def _finish(self, run: _Running, running: dict[int, _Running]) -> None:
        run.job.latency_s = time.perf_counter() - run.started
        del running[run.seq]

    def close(self) -> None:
        """Free the context and the model now rather than at garbage collection."""
        if self._ctx:
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self._ctx)
            self._lc.llama_model_free(self._model)
            self._ctx = None
