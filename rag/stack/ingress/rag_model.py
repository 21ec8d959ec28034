"""The `rag` model: `rag ask`'s guarded, cited answer on /v1/chat/completions.

Any OpenAI client (the SDK, LangChain, LlamaIndex, litellm, Open WebUI) asks the
documents by naming `model: "rag"`. The request is the whole conversation, as for any
chat model, and the server keeps nothing between requests: the last message is the
question, the user and assistant messages before it the history (the last
`history_messages` of them go to the chat model); system and developer messages are
extra instructions after the pipeline's own (rag/answer.py), and the input guard reads
them with the question, so none talks past it. The reply is rag/pipeline.py's, unchanged:
guard in -> embed -> retrieve -> rerank -> answer -> guard out -> attribute, its engine
calls made through the ingress's Serve handles (handles.py), in a worker thread, in
the OpenAI shape of completion.py, streamed or not.

Which index: the folder `rag serve --index` names (RAG_INDEX_DIR), re-read when
`rag index` commits a new generation (rag.store.LiveIndex): a request sees the old
index or the new one, and before there is any the answer is a 503 naming `rag index`.

Limits (`RagLimits`, published in /v1/models): messages and characters per request,
`workers` answers at once and as many waiting, counted by the edge's Admission like
an engine's batch (429 with Retry-After past them). Prometheus: each stage's seconds
(`rag_answer_stage_seconds`) and each answer's outcome (`rag_answers_total`).

Over 300 lines because the request's checks and the two ways an answer goes out
(whole, or streamed from the pipeline's thread) read best beside each other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from rag.attribute import Sentence
from rag.errors import ConfigError
from rag.pipeline import Answer, Pipeline
from rag.settings import Settings
from rag.stack.admission import Capacity
from rag.stack.ingress.completion import (
    Transcript,
    chunk,
    completion,
    finish_reason,
    rag_field,
    source_json,
    usage_chunk,
)
from rag.stack.ingress.errors import openai_error, refuse
from rag.stack.ingress.handles import Call, EngineError, HandleEngines
from rag.stack.ingress.limits import Refusal
from rag.store import LiveIndex

__all__ = ["NEEDED", "RAG_MODEL", "Conversation", "RagLimits", "RagModel", "Readiness", "read_conversation"]

RAG_MODEL = "rag"
STAGE_BUCKETS_S = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


@dataclass(frozen=True)
class RagLimits:
    """What one `rag` request may hold, and how many answers run at once."""

    max_messages: int = 64
    max_chars: int = 32_000  # all messages' text together
    max_question_chars: int = 4_000  # the guard and the reranker read the question whole
    history_messages: int = 6  # the last three turns go to the chat model with the sources
    max_tokens: int = 384  # a larger max_tokens is lowered to this (the answer is three sentences)
    workers: int = 4  # answers at once: each holds a chat sequence and guard calls
    queued: int = 4
    retry_after_s: float = 10.0  # an answer takes 5-20 s on 2 CPU cores

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def capacity(self) -> Capacity:
        return Capacity(self.workers + self.queued, self.retry_after_s)


@dataclass(frozen=True)
class Conversation:
    question: str
    history: list[dict[str, str]]
    max_tokens: int
    instructions: str = ""  # the system and developer messages, in order


def _text(content: Any, where: str) -> str | Refusal:
    """A message's text: a string, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                return Refusal(
                    f"{where}[{i}] is a {kind!r} part; the `rag` model reads text only", f"{where}[{i}]"
                )
            parts.append(str(part.get("text") or ""))
        return "".join(parts)
    return Refusal(f"{where} must be a string or a list of text parts", where)


def _unsupported(body: ChatCompletionRequest) -> Refusal | None:
    """Fields the `rag` model cannot honour (sampling fields are accepted: it answers at
    temperature 0, as `rag ask` does)."""
    if body.tools:
        return Refusal(
            "tools: the `rag` model answers from the index and calls no tools; use model `chat`", "tools"
        )
    fmt = getattr(body.response_format, "type", None)
    if fmt not in (None, "text"):
        return Refusal(
            "response_format: the `rag` model answers in text with its sources; use model `chat` for "
            "structured output",
            "response_format",
        )
    if body.logprobs or body.top_logprobs:
        return Refusal("logprobs: the `rag` model returns no log probabilities", "logprobs")
    if (body.n or 1) > 1:
        return Refusal("n: the `rag` model gives one answer per request", "n")
    return None


def read_conversation(body: ChatCompletionRequest, limits: RagLimits) -> Conversation | Refusal:
    """The question and history of a `rag` request, or why it is refused."""
    if refusal := _unsupported(body):
        return refusal
    messages = list(body.messages or [])
    if not messages:
        return Refusal(
            "messages is empty; send the conversation, ending with the user's question", "messages"
        )
    if len(messages) > limits.max_messages:
        return Refusal(
            f"messages holds {len(messages)} messages; the `rag` model takes at most {limits.max_messages} "
            "(send the recent part of the conversation)",
            "messages",
        )
    turns: list[dict[str, str]] = []
    system: list[str] = []
    total = 0
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in ("system", "developer", "user", "assistant"):
            return Refusal(
                f"messages[{i}].role is {role!r}; the `rag` model takes system, user and assistant messages",
                f"messages[{i}].role",
            )
        text = _text(message.get("content"), f"messages[{i}].content")
        if isinstance(text, Refusal):
            return text
        total += len(text)
        if role in ("user", "assistant"):
            turns.append({"role": str(role), "content": text})
        elif text.strip():
            system.append(text.strip())
    if total > limits.max_chars:
        return Refusal(
            f"the messages hold {total} characters; the `rag` model takes at most {limits.max_chars}",
            "messages",
        )
    if not turns or turns[-1]["role"] != "user" or not turns[-1]["content"].strip():
        return Refusal("the last message must be the user's question", f"messages[{len(messages) - 1}]")
    question = turns[-1]["content"].strip()
    if len(question) > limits.max_question_chars:
        return Refusal(
            f"the question is {len(question)} characters; at most {limits.max_question_chars}",
            f"messages[{len(messages) - 1}].content",
        )
    instructions = "\n\n".join(system)
    if len(instructions) > limits.max_question_chars:
        return Refusal(
            f"the system messages hold {len(instructions)} characters; at most {limits.max_question_chars} "
            "(the guard reads them whole, with the question)",
            "messages",
        )
    asked = body.max_completion_tokens or body.max_tokens or limits.max_tokens
    history = turns[:-1][-limits.history_messages :] if limits.history_messages else []
    return Conversation(question, history, min(int(asked), limits.max_tokens), instructions)


# The engines every answer calls. The reranker is called only in some rerank modes; were it
# down there, that answer's call says so (502).
NEEDED = ("chat", "guard", "embed")
READY_TTL_S = 1.0  # Serve's deployment states are asked at most this often


class Readiness:
    """Which engines an answer needs are not serving yet (booting, or coming back after a
    crash), from Serve's deployment states; a request then gets 503 at once, with
    Retry-After, instead of waiting in a handle for a replica."""

    def __init__(self, states: Callable[[], Mapping[str, str]], ttl_s: float = READY_TTL_S) -> None:
        self._states, self._ttl_s = states, ttl_s
        self._asked, self._waiting = -ttl_s, list[str]()

    async def waiting_for(self) -> list[str]:
        """The needed engines that are not HEALTHY (asked off the event loop)."""
        now = time.monotonic()
        if now - self._asked >= self._ttl_s:
            try:
                states = await asyncio.get_running_loop().run_in_executor(None, self._states)
            except Exception:  # Serve's controller did not say: the answer's own calls will
                states = {}
            self._waiting = [r for r in NEEDED if states.get(r, "HEALTHY") != "HEALTHY"]
            self._asked = time.monotonic()
        return self._waiting


class _Gone(Exception):
    """The client went away: stop answering."""


def _sse(data: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class RagModel:
    """Answers `rag` requests inside the ingress replica."""

    def __init__(
        self,
        settings: Settings,
        index: LiveIndex,
        limits: RagLimits,
        call: Call,
        facts: Callable[[], Mapping[str, Mapping[str, Any]]],
        readiness: Readiness,
    ) -> None:
        self.settings, self.index, self.limits = settings, index, limits
        self._call, self._facts, self._readiness = call, facts, readiness
        self._pool = ThreadPoolExecutor(limits.workers, thread_name_prefix="rag-answer")
        from ray.util.metrics import Counter, Histogram  # on the replica, where Ray exports them

        self._stage_s = Histogram(
            "rag_answer_stage_seconds", description="Seconds each stage of a `rag` answer took",
            boundaries=STAGE_BUCKETS_S, tag_keys=("stage",),
        )  # fmt: skip
        self._answers = Counter(
            "rag_answers_total", description="`rag` answers by outcome", tag_keys=("outcome",)
        )

    def _record(self, answer: Answer | None) -> None:
        if answer is None:
            self._answers.inc(tags={"outcome": "error"})
            return
        for stage, seconds in answer.timings.items():
            self._stage_s.observe(seconds, tags={"stage": stage})
        outcome = (
            f"refused_{answer.blocked}" if answer.blocked else "answered" if answer.covered else "not_covered"
        )
        self._answers.inc(tags={"outcome": outcome})

    async def respond(self, body: ChatCompletionRequest) -> Response:
        conversation = read_conversation(body, self.limits)
        if isinstance(conversation, Refusal):
            return refuse(conversation)
        if waiting := await self._readiness.waiting_for():
            retry = math.ceil(self.limits.retry_after_s)
            return openai_error(
                503, f"the `rag` model is starting: the {', '.join(waiting)} engine(s) are not serving yet; "
                f"retry after {retry} s", headers={"Retry-After": str(retry)},
            )  # fmt: skip
        loop = asyncio.get_running_loop()
        try:
            index = await loop.run_in_executor(None, self.index.current)  # not behind the answers
        except ConfigError as exc:
            return openai_error(503, str(exc))
        settings = dataclasses.replace(self.settings, max_tokens=conversation.max_tokens)
        pipeline = Pipeline(settings, HandleEngines(self._call, loop, settings, self._facts()), index)
        request_id, created = f"chatcmpl-rag-{uuid.uuid4().hex}", int(time.time())
        generation = str(index.manifest.get("generation"))
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = self._stream(pipeline, conversation, request_id, created, generation, include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            c = conversation
            answer = await loop.run_in_executor(
                self._pool, lambda: pipeline.ask(c.question, history=c.history, instructions=c.instructions)
            )
        except Exception as exc:
            self._record(None)
            return _failure(exc)
        self._record(answer)
        transcript = Transcript()
        if not answer.blocked:  # a refused answer shows the refusal alone
            transcript.add_sentences(answer.sentences)
        _close(transcript, answer)
        return JSONResponse(
            completion(answer, transcript, request_id=request_id, created=created, generation=generation)
        )

    async def _stream(
        self,
        pipeline: Pipeline,
        conversation: Conversation,
        request_id: str,
        created: int,
        generation: str,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        gone = threading.Event()

        def put(kind: str, value: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, (kind, value))

        def on_sentences(answer: Answer, sentences: list[Sentence]) -> None:
            if gone.is_set():
                raise _Gone
            put("sentences", (answer, sentences))

        def on_early(words: str) -> None:
            if gone.is_set():
                raise _Gone
            put("early", words)

        def run() -> None:
            if gone.is_set():  # it waited for a worker, and its client left meanwhile
                return
            try:
                c = conversation
                answer = pipeline.ask(
                    c.question, history=c.history, instructions=c.instructions,
                    on_sentences=on_sentences, on_early=on_early,
                )  # fmt: skip
                put("done", answer)
            except BaseException as exc:  # handed to the stream, which says it
                put("error", exc)

        loop.run_in_executor(self._pool, run)
        transcript = Transcript()
        sources_sent = False
        try:
            yield _sse(chunk(request_id, created, {"role": "assistant", "content": ""}))
            while True:
                kind, value = await events.get()
                if kind == "early":  # the first words, guarded, before their sentence ends
                    if delta := transcript.add_early(value):
                        yield _sse(chunk(request_id, created, {"content": delta}, rag={"early": True}))
                    continue
                if kind == "sentences":
                    answer, sentences = value
                    delta, added = transcript.add_sentences(sentences)
                    extra: dict[str, Any] = {"sentences": added}
                    if not sources_sent:
                        extra["sources"] = [source_json(s) for s in answer.sources]
                        sources_sent = True
                    yield _sse(chunk(request_id, created, {"content": delta}, rag=extra))
                    continue
                if kind == "error":
                    self._record(None)
                    yield _sse({"error": json.loads(bytes(_failure(value).body))["error"]})
                    break
                answer = value
                self._record(answer)
                if tail := _close(transcript, answer):
                    yield _sse(chunk(request_id, created, {"content": tail}))
                final = {"annotations": transcript.annotations(answer.sources)}
                rag = rag_field(answer, transcript, generation)
                yield _sse(chunk(request_id, created, final, finish=finish_reason(answer), rag=rag))
                if include_usage:
                    yield _sse(usage_chunk(request_id, created, answer))
                break
            yield "data: [DONE]\n\n"
        finally:  # the client went away or the answer ended: the thread stops at its next sentence
            gone.set()


def _close(transcript: Transcript, answer: Answer) -> str:
    """What follows the sentences in `content`: the refusal, "not covered", or the
    fallback passage and the sources list (Answer.tail, as `rag ask` prints it)."""
    if answer.blocked:
        return transcript.add_text(answer.refusal())
    if not answer.covered and not transcript.sentences:
        return transcript.add_text(answer.text)
    tail = answer.tail()
    return transcript.add_text(tail) if tail else ""


# What a call to a dead engine raises until Serve has replaced it: vLLM's, then Ray's.
_REPLACED = frozenset({"EngineDeadError", "RayActorError", "ActorDiedError", "ActorUnavailableError"})


def _failure(exc: BaseException) -> JSONResponse:
    """An answer that could not be given, as the OpenAI error shape."""
    if isinstance(exc, EngineError):
        status = 429 if exc.status == 429 else 502
        headers = {"Retry-After": "10"} if status == 429 else None
        return openai_error(status, f"the `rag` model could not answer: {exc}", headers=headers)
    if isinstance(exc, ConfigError):
        return openai_error(503, str(exc))
    if _REPLACED & {t.__name__ for t in type(exc).__mro__}:  # Serve is replacing that engine
        return openai_error(
            503, f"the `rag` model could not answer: an engine is being replaced ({exc}); retry later",
            headers={"Retry-After": "10"},
        )  # fmt: skip
    return openai_error(500, f"the `rag` model failed: {type(exc).__name__}: {exc}")
