"""An OpenAI Agents SDK session (``agents.memory.Session``) stored as an overnight task.

Change one line and an agent's conversation history gets overnight's verified, content-addressed,
crash-safe storage on any store URL::

    from overnight.adapters.openai_agents import OvernightSession

    session = OvernightSession("user-42", store="sqlite:///srv/agents.db")
    result = await Runner.run(agent, "Hello", session=session)

How a session is stored (the checkpoint format itself is ``docs/FORMAT.md``):

* a session is one overnight **task**, id ``agents.<session_id>`` (``agents.<sha256 prefix>``
  when the session id is not a valid task id), registered with the spec
  ``{"kind": "openai-agents-session", "session_id": ...}``; ``overnight log``, ``show``,
  ``verify``, ``cat``, ``gc`` and ``fork`` work on it as on any task;
* every change (``add_items``, ``pop_item``, ``clear_session``, a compaction) is one
  **checkpoint** on branch ``main``, appended by compare-and-swap of the branch ref: two writers
  -- threads, processes or machines sharing the store -- that read the same head cannot both
  commit; the loser reloads and retries. ``pop_item`` therefore never returns an item twice and
  never loses one, whatever runs at the same time;
* each item is one **artifact** ``items/NNNNNNNNNNNN`` (a 12-digit sequence number the writer
  assigns under the same compare-and-swap), its canonical JSON (:mod:`overnight.codec.canonical`)
  stored as a content-addressed blob. Order is the sequence number, never a timestamp, so items
  added in the same microsecond keep their order, and identical items are stored once. Adding
  an item writes that item and one artifact page, not the whole history;
* reading an item checks its digest; a head checkpoint or an item that fails verification
  raises :class:`~overnight.errors.SessionCorrupt` naming the session -- nothing is skipped;
* each operation first reads the branch ref (one query). While it still names the checkpoint
  this object last loaded and verified, or committed itself, the object works from its copy of
  that checkpoint: its item list, and the items it wrote or already checked (kept decoded, a new
  value returned on every read); the next commit re-stores only the last artifact page, the state
  document and the record. When another writer moved the ref, the new head is loaded and
  verified first, and items not seen before are read and checked.

Context budget (optional, ``max_context_tokens=N``): when the items reach ``compaction_threshold``
x N tokens after an ``add_items``, the oldest items are summarised by overnight's compaction
(:func:`overnight.runtime.session.summary_request`, the task's model, the call journal) and
replaced by one summary item, in a ``compaction`` checkpoint; the newest items stay verbatim.
Nothing is cleared first: the checkpoint before the compaction still holds every item
(``overnight log TASK``, :meth:`OvernightSession.get_items_at`).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from overnight.codec.canonical import dumps, dumps_sorted, from_tree, loads, to_tree
from overnight.errors import (
    CheckpointNotFound,
    ConfigError,
    IntegrityError,
    SessionCorrupt,
    StaleHead,
    TaskNotFound,
    short_id,
)
from overnight.models import Model, model_from_spec
from overnight.runtime.call_journal import replayable, response_bytes
from overnight.runtime.session import Budget, request_digest, summary_request, summary_tokens
from overnight.store import Store, open_store
from overnight.store.base import Closing, CallRecord, TaskRow
from overnight.store.blobs import BlobReader
from overnight.tokens import Tokenizer, tokenizer_for
from overnight.chain.write import ChainWriter, utc_now
from overnight.chain.rollback import refuse_rollback
from overnight.chain.integrity import (
    BoundedPageCache,
    LoadedCheckpoint,
    load_checkpoint,
    signing_key_from_env,
)
from overnight.chain.records import artifact_ref, context_info, event, initial_state

try:
    from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
except ImportError as _exc:  # pragma: no cover - the extra is part of the test environment
    raise ConfigError("overnight.adapters.openai_agents needs the 'openai-agents' package",
                      hint="pip install 'overnight[agents]'") from _exc

__all__ = ["KIND", "OvernightSession", "session_task_id"]

KIND = "openai-agents-session"
"""``spec["kind"]`` of a task that holds an Agents SDK session."""

BRANCH = "main"
ITEM_PREFIX = "items/"
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,189}")


def session_task_id(session_id: str) -> str:
    """The overnight task id that stores ``session_id``: ``agents.<session_id>``, or
    ``agents.<first 40 hex digits of its SHA-256>`` when the id has characters (or a length) a
    task id cannot have. Raises ConfigError for an empty or non-str id."""
    if not isinstance(session_id, str) or not session_id:
        raise ConfigError(f"session_id must be a non-empty str, got {session_id!r}")
    if _TASK_ID.fullmatch(session_id):
        return f"agents.{session_id}"
    return "agents." + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _item_name(n: int) -> str:
    return f"{ITEM_PREFIX}{n:012d}"


def item_text(item: Any) -> str:
    """The text of an item the context budget counts: a message's content (its text parts, for a
    list of parts), else the item's canonical JSON (tool calls and their outputs, reasoning)."""
    if isinstance(item, dict) and "role" in item:
        content = item.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return dumps_sorted(to_tree(item, "item")).decode("ascii")


def _tool_output(item: Any) -> bool:
    """Is this item a tool's output (``function_call_output``, ``computer_call_output``, ...)?"""
    return isinstance(item, dict) and str(item.get("type", "")).endswith("_call_output")


@dataclass(frozen=True)
class _Head:
    """This object's copy of the session's head checkpoint ``id``: verified when it was loaded, or
    written by this object. ``chain`` is the writer continuing from it (its page and copy caches
    carry over from commit to commit), ``state`` its state tree, ``items`` its items (name ->
    artifact ref tree, in order; never changed once the head is made), ``next`` the sequence
    number of the next item added."""

    id: str
    chain: ChainWriter
    state: dict[str, Any]
    items: dict[str, dict[str, Any]]
    next: int


class OvernightSession(Closing):
    """An Agents SDK ``Session`` backed by an overnight store (see the module docstring).

    Args:
        session_id: the conversation's id (any non-empty str).
        store: a store URL (``sqlite://PATH``, ``file://DIR``, ``postgresql://...``, ``s3://...``),
            a :class:`~overnight.store.Store`, or None for the default store (``$OVERNIGHT_STORE``,
            ``overnight.toml``, else ``.overnight/overnight.db``). A store opened here is closed
            by :meth:`close`.
        session_settings: the SDK's ``SessionSettings`` (or a dict); its ``limit`` is the default
            of :meth:`get_items`.
        max_context_tokens: context budget in tokens (None: no budget, nothing is compacted).
        compaction_threshold: compact when the items reach this share of the budget (0.8).
        model: the model that writes compaction summaries (a :class:`~overnight.models.Model` or a
            spec: ``extractive``, the offline default, ``local``, ``openai:NAME``).
        tokenizer: model or encoding name the budget counts with (default ``o200k_base``).
        signing_key: HMAC key for signing and verifying checkpoints (default
            ``$OVERNIGHT_SIGNING_KEY``; ``b""`` disables signing).

    Attributes:
        session_id: the session's id.
        task_id: the overnight task holding it (:func:`session_task_id`).
        session_settings: the SDK settings (None when not given).
        budget: the context budget (:class:`~overnight.runtime.session.Budget`: ``max_tokens``,
            ``threshold``, ``compact_at`` in tokens), None without one.

    Raises:
        ConfigError: a bad argument, or the task id is taken by something that is not this session.
    """

    def __init__(
        self,
        session_id: str,
        store: Store | str | os.PathLike | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        max_context_tokens: int | None = None,
        compaction_threshold: float = 0.8,
        model: Model | str | None = None,
        tokenizer: str | None = None,
        signing_key: bytes | None = None,
    ) -> None:
        self.task_id = session_task_id(session_id)
        self.session_id = session_id
        self.session_settings = coerce_session_settings(session_settings) if session_settings is not None else None
        if max_context_tokens is not None and (not isinstance(max_context_tokens, int) or max_context_tokens < 256):
            raise ConfigError(f"session {session_id!r}: max_context_tokens must be an int >= 256 (tokens), "
                              f"got {max_context_tokens!r}", task_id=self.task_id)
        if not 0 < compaction_threshold <= 1:
            raise ConfigError(f"session {session_id!r}: compaction_threshold must be in (0, 1], "
                              f"got {compaction_threshold!r}", task_id=self.task_id)
        self.budget = Budget(max_context_tokens, compaction_threshold) if max_context_tokens else None
        self._model_spec = model
        self._model: Model | None = model if hasattr(model, "complete") else None  # type: ignore[assignment]
        self._tokenizer: Tokenizer = tokenizer_for(tokenizer)
        self._own_store = not hasattr(store, "commit")
        self._store: Store = open_store(store) if self._own_store else store  # type: ignore[arg-type]
        self._key = signing_key_from_env() if signing_key is None else (signing_key or None)
        self._run_id = uuid.uuid4().hex
        self._view: _Head | None = None  # the head this object last loaded or wrote
        self._lock = threading.Lock()  # one operation of this object at a time uses _view and its chain
        self._trees: dict[str, Any] = {}  # item digest -> its verified (or self-written) canonical tree
        self._pages = BoundedPageCache()  # verified pages by digest: a load parses only the new ones
        self._pages_lock = threading.Lock()  # guards the cache only; writes are ordered by the CAS

    # -- the Session protocol ---------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items, oldest first; with ``limit`` (default ``session_settings.limit``)
        the newest ``limit`` of them, still oldest first (``0``: none; negative: all).

        Raises:
            SessionCorrupt: the head checkpoint or an item failed verification.
        """
        return await asyncio.to_thread(self._get_items, resolve_session_limit(limit, self.session_settings))

    async def add_items(self, items: list[Any]) -> None:
        """Append items (in the given order) in one checkpoint; then, under a context budget, compact
        if the items reach the threshold.

        Raises:
            EncodeError: an item holds a value the codec cannot store (its path and type named).
            SessionCorrupt: the head checkpoint failed verification.
        """
        await asyncio.to_thread(self._add_items, list(items))

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item (None when the session is empty), atomically: of
        concurrent pops -- in any thread or process -- each item goes to exactly one.

        Raises:
            SessionCorrupt: the head checkpoint or the item failed verification.
        """
        return await asyncio.to_thread(self._pop_item)

    async def clear_session(self) -> None:
        """Remove every item, in one checkpoint (earlier checkpoints keep the history)."""
        await asyncio.to_thread(self._clear)

    # -- beyond the protocol ----------------------------------------------------------------------

    async def get_items_at(self, checkpoint_id: str) -> list[Any]:
        """The items as they were at one checkpoint of this session (``overnight log TASK_ID``
        lists them), e.g. the full history before a compaction.

        Raises:
            CheckpointNotFound: no such checkpoint in this session.
            SessionCorrupt: it failed verification.
        """
        def read() -> list[Any]:
            loaded = self._verified(checkpoint_id)
            if loaded.record.task_id != self.task_id:
                raise CheckpointNotFound(f"checkpoint {short_id(checkpoint_id)} is not in session "
                                         f"{self.session_id!r}", task_id=self.task_id, checkpoint_id=checkpoint_id)
            return self._decode(loaded.id, list(self._items(loaded).items()))

        return await asyncio.to_thread(read)

    def close(self) -> None:
        """Close the store if this object opened it. Idempotent."""
        if self._own_store:
            self._store.close()

    # -- reading ------------------------------------------------------------------------------------

    def _corrupt(self, exc: IntegrityError | CheckpointNotFound, checkpoint_id: str, what: str) -> SessionCorrupt:
        return SessionCorrupt(
            f"session {self.session_id!r}: {what} failed verification: {exc.message}",
            session_id=self.session_id, task_id=self.task_id, checkpoint_id=checkpoint_id,
            object_digest=getattr(exc, "object_digest", None),
            hint=f"`overnight verify {self.task_id}` reports the damage; `overnight log {self.task_id}` lists "
                 f"earlier checkpoints to `overnight rollback {self.task_id} --to` one that verifies")

    def _verified(self, checkpoint_id: str) -> LoadedCheckpoint:
        try:
            with self._pages_lock:
                loaded = load_checkpoint(self._store, checkpoint_id, key=self._key, deep=False, pages=self._pages)
        except (IntegrityError, CheckpointNotFound) as exc:
            raise self._corrupt(exc, checkpoint_id, f"checkpoint {short_id(checkpoint_id)}") from exc
        spec = loaded.doc.task.spec
        if spec.get("kind") != KIND or spec.get("session_id") != self.session_id:
            raise ConfigError(f"task {self.task_id!r} in {self._store.url} is not the Agents SDK session "
                              f"{self.session_id!r}", task_id=self.task_id, checkpoint_id=checkpoint_id,
                              hint="use another session_id, or another store")
        return loaded

    def _head(self) -> _Head | None:
        """The head checkpoint (None: the session has none yet). One ref read when the branch still
        names the head this object last loaded or wrote; otherwise (another writer moved it) the
        new head is loaded and verified. Call with ``self._lock`` held."""
        ref = self._store.get_ref(self.task_id, BRANCH)
        if ref is None:
            try:
                self._store.get_task(self.task_id)
            except TaskNotFound:
                return None
            # Every store makes a task visible only with its first checkpoint's ref (one
            # transaction; the keyed stores hide a task no ref ever named), so the task seen here
            # may be a concurrent writer's first commit landed since the ref was read: read the
            # ref again. Still none: the branch was deleted (or the task is not a session).
            ref = self._store.get_ref(self.task_id, BRANCH)
        if ref is None:
            raise ConfigError(f"task {self.task_id!r} in {self._store.url} has no branch {BRANCH!r}",
                              task_id=self.task_id, hint=f"`overnight log {self.task_id}` shows its branches")
        head = self._view
        if head is not None and head.id == ref:
            return head
        self._view = None
        loaded = self._verified(ref)
        refuse_rollback(self._store, loaded, key=self._key, branch=BRANCH, named=ref)  # items lost otherwise
        if head is not None and loaded.record.parent_id == head.id:
            chain = head.chain  # the new head extends this object's: what its writer knows still holds
            chain.session_n = loaded.record.session.n
        else:
            chain = ChainWriter(self._store, self.task_id, BRANCH, key=self._key, session_id=self._run_id,
                                session_n=loaded.record.session.n)
        chain.start_from(loaded, None)
        self._view = head = _Head(loaded.id, chain, loaded.state_tree, self._items(loaded), self._next(loaded))
        return head

    @staticmethod
    def _items(loaded: LoadedCheckpoint) -> dict[str, dict[str, Any]]:
        """The items (name -> artifact ref tree), in order."""
        return {n: a for n, a in loaded.state_tree["artifacts"].items() if n.startswith(ITEM_PREFIX)}

    @staticmethod
    def _next(loaded: LoadedCheckpoint) -> int:
        return int(from_tree(loaded.data, "state.data")["next"])

    def _decode(self, checkpoint_id: str, items: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """The values of ``items`` (``(name, artifact ref)`` of checkpoint ``checkpoint_id``). An
        item is read from the store, checked against its digest and size and parsed once per object
        (all missing ones in one store call); items this object wrote or already checked are
        decoded from that verified tree -- a new value every call."""
        trees = self._trees
        missing = [a["digest"] for _, a in items if a["digest"] not in trees]
        if missing:
            try:
                fetched = BlobReader(self._store).get_many(missing, f"session {self.session_id!r} items")
            except IntegrityError as exc:
                name = next((n for n, a in items if a["digest"] == exc.object_digest), None)
                raise self._corrupt(exc, checkpoint_id, f"item {name!r}" if name else "an item") from exc
            for name, ref in items:
                raw = fetched.get(ref["digest"])
                if raw is None:
                    continue
                if len(raw) != ref["size"]:
                    exc = IntegrityError(f"item is {len(raw)} bytes, its reference says {ref['size']}",
                                         object_digest=ref["digest"])
                    raise self._corrupt(exc, checkpoint_id, f"item {name!r}")
                trees[ref["digest"]] = loads(raw)
        return [from_tree(trees[a["digest"]], f"session {self.session_id!r} item {n!r}") for n, a in items]

    def _get_items(self, limit: int | None) -> list[Any]:
        with self._lock:
            head = self._head()
        if head is None:
            return []
        if limit is not None and 0 <= limit < len(head.items):
            items = list(itertools.islice(reversed(head.items.items()), limit))[::-1]
        else:
            items = list(head.items.items())
        return self._decode(head.id, items)

    # -- writing ------------------------------------------------------------------------------------

    def _commit(self, head: _Head | None, items: dict[str, dict[str, Any]], ev: dict[str, Any], *,
                new: dict[str, Any] | None = None, context: dict[str, Any] | None = None,
                new_session: bool = False, next_item: int | None = None, drop_last: bool = False) -> None:
        """One checkpoint whose items are ``items`` (name -> artifact ref, in order; not changed
        here), without its last one with ``drop_last``, followed by ``new`` (name -> ``(canonical
        bytes, tree)`` of items to store, names after the others'). Raises StaleHead when the head
        moved since ``head``. Call with ``self._lock`` held."""
        if head is None:
            chain = ChainWriter(self._store, self.task_id, BRANCH, key=self._key, session_id=self._run_id,
                                session_n=1)
            spec = {"kind": KIND, "session_id": self.session_id,
                    "route": {"level": "durable", "media": [], "urls": [self._store.url],
                              "reasons": ["an OpenAI Agents SDK session (overnight.adapters.openai_agents)"]}}
            goal = f"OpenAI Agents SDK session {self.session_id!r}"
            state: dict[str, Any] = initial_state(self.task_id, goal, spec)
            task_row = TaskRow(self.task_id, utc_now(), goal, None, dumps_sorted(spec))
            nxt = 1
        else:
            chain, state, task_row, nxt = head.chain, dict(head.state), None, head.next
        writer = chain.blob_writer()
        artifacts = dict(items)
        if drop_last and artifacts:
            artifacts.popitem()
        for name, (raw, _) in (new or {}).items():
            artifacts[name] = artifact_ref(writer.put(raw), len(raw), text=True, step=None)
        if new and items and min(new) < next(reversed(items)):  # a compaction's summary goes before the kept items
            artifacts = dict(sorted(artifacts.items()))
        nxt = nxt if next_item is None else next_item
        state["artifacts"] = artifacts
        state["data"] = {"next": nxt}
        if context is not None:
            state["context"] = context
        chain.session_n += new_session
        self._view = None  # a commit that fails leaves the chain unsure of the store: the next operation reloads
        cid = chain.commit(state, ev, writer=writer, task_row=task_row)
        trees = self._trees
        for name, (_, tree) in (new or {}).items():
            trees[artifacts[name]["digest"]] = tree
        if len(trees) > 2 * len(artifacts) + 64:  # popped, cleared or compacted items are not kept
            live = {a["digest"] for a in artifacts.values()}
            self._trees = {d: t for d, t in trees.items() if d in live}
        self._view = _Head(cid, chain, state, artifacts, nxt)

    def _mutate(self, change: Any) -> Any:
        """Run ``change(head) -> (result, commit kwargs or None)`` until its commit wins the
        compare-and-swap of the branch ref (another writer moved it: reload, run again)."""
        delay = 0.001
        while True:
            with self._lock:
                head = self._head()
                result, args = change(head)
                if args is None:
                    return result
                try:
                    self._commit(head, **args)
                    return result
                except StaleHead:
                    pass
            time.sleep(random.uniform(0, delay))  # jitter: concurrent writers spread out
            delay = min(delay * 2, 0.05)

    def _add_items(self, items: list[Any]) -> None:
        if not items:
            return
        trees = [to_tree(item, f"session {self.session_id!r} items[{i}]") for i, item in enumerate(items)]
        encoded = [(dumps(t), t) for t in trees]

        def change(head: _Head | None) -> tuple[None, dict[str, Any]]:
            first = head.next if head is not None else 1
            return None, {"items": head.items if head is not None else {},
                          "new": {_item_name(first + i): e for i, e in enumerate(encoded)},
                          "next_item": first + len(encoded),
                          "ev": event("step", step="add_items", detail=f"+{len(encoded)} items")}

        self._mutate(change)
        if self.budget is not None:
            self._compact()

    def _pop_item(self) -> Any | None:
        def change(head: _Head | None) -> tuple[Any, dict[str, Any] | None]:
            if head is None or not head.items:
                return None, None
            name = next(reversed(head.items))
            value = self._decode(head.id, [(name, head.items[name])])[0]
            return value, {"items": head.items, "drop_last": True,
                           "ev": event("step", step="pop_item", detail=f"-{name}")}

        return self._mutate(change)

    def _clear(self) -> None:
        def change(head: _Head | None) -> tuple[None, dict[str, Any] | None]:
            if head is None:
                return None, None
            return None, {"items": {}, "ev": event("step", step="clear_session", detail=f"-{len(head.items)} items")}

        self._mutate(change)

    # -- compaction ---------------------------------------------------------------------------------

    def count(self, item: Any) -> int:
        """Tokens the budget counts for one item (:func:`item_text` through the tokenizer)."""
        return self._tokenizer.count(item_text(item))

    def _summarise(self, key: str, transcript: str) -> str:
        """The summary of ``transcript``, replayed from the call journal when this very request was
        already answered (a compaction that lost its commit race, or was killed)."""
        if self._model is None:
            self._model = model_from_spec(self._model_spec)  # type: ignore[arg-type]
        model = self._model
        assert self.budget is not None
        messages, reply = summary_request(self._tokenizer, self.budget.max_tokens, transcript, task_id=self.task_id)
        req = request_digest(model.name, messages, reply, 0.0)
        for call in self._store.calls(self.task_id, key):
            if call.seq == 0 and call.request_digest == req:
                body, _ = replayable(call, self._key)  # a damaged or forged row: summarise again
                if body is not None:
                    return body["text"]
        t0 = time.perf_counter()
        done = model.complete(messages, max_tokens=reply, temperature=0.0)
        self._store.record_call(CallRecord(
            self.task_id, key, 0, req, done.model,
            response_bytes(self._key, self.task_id, key, 0, req, done.model, done.text, done.finish_reason,
                           done.tokens_in, done.tokens_out),
            done.tokens_in, done.tokens_out, (time.perf_counter() - t0) * 1000, utc_now()))
        return done.text

    def _fit(self, text: str, limit: int) -> dict[str, str]:
        """The summary item, its text cut at the end until the item counts at most ``limit`` tokens."""
        decode = getattr(self._tokenizer, "decode", None)
        ids = self._tokenizer.encode(text)
        keep = len(ids)
        while True:
            item = {"role": "system", "content": SUMMARY_PREFIX + text}
            over = self.count(item) - limit
            if over <= 0 or not text:
                return item
            keep = max(0, min(keep - over, keep - 1))
            text = decode(ids[:keep]) if decode is not None else text[: len(text) * keep // max(len(ids), 1)]

    def _compact(self) -> None:
        """One compaction if the items reach the threshold: the oldest items become one summary
        item, the newest items that fit in half of what the summary leaves of the threshold stay
        verbatim (a tool call's output is never kept without its call)."""
        budget = self.budget
        assert budget is not None
        limit = summary_tokens(budget.max_tokens)
        keep = max(0, (budget.compact_at - limit) // 2)

        def change(head: _Head | None) -> tuple[None, dict[str, Any] | None]:
            items = list(head.items.items()) if head is not None else []
            values = self._decode(head.id, items) if head is not None else []
            tokens = [self.count(v) for v in values]
            if sum(tokens) < budget.compact_at or len(items) < 2:
                return None, None
            cut, kept = len(items), 0
            while cut > 1 and kept + tokens[cut - 1] <= keep:
                cut -= 1
                kept += tokens[cut]
            cut = min(cut, len(items) - 1)  # keep the newest item at least
            while cut < len(items) - 1 and _tool_output(values[cut]):
                cut += 1  # an output whose call is summarised goes into the summary too
            if _tool_output(values[cut]):  # the newest item is a tool output: keep its call with it
                call_id = values[cut].get("call_id")
                cut = next((i for i in range(cut - 1, 0, -1)
                            if isinstance(values[i], dict) and values[i].get("call_id") == call_id), 0)
                if cut == 0:
                    return None, None
            transcript = "\n\n".join(f"{v.get('role') or v.get('type', 'item')}: {item_text(v)}"
                                     if isinstance(v, dict) else item_text(v) for v in values[:cut])
            assert head is not None
            text = self._summarise(f"compaction:{head.id}", transcript)
            summary = self._fit(text, limit)
            tree = to_tree(summary, "summary")
            ctx = head.state["context"]
            return None, {
                "items": dict(items[cut:]), "new": {items[cut - 1][0]: (dumps(tree), tree)},
                "context": context_info(summary["content"], ctx["compactions"] + 1),
                "new_session": True,
                "ev": event("compaction", ref=head.id,
                            detail=f"{cut} items ({sum(tokens[:cut])} tokens) -> a {self.count(summary)}-token summary; "
                                   f"{len(items) - cut} newest items kept verbatim; the full history is "
                                   f"checkpoint {short_id(head.id)}"),
            }

        self._mutate(change)
