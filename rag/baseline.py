"""The simple way to serve a chat model, for `rag bench` to measure against.

An OpenAI-style /v1/chat/completions (streamed or not) over transformers'
`generate`, one request at a time behind a lock: two callers queue behind each
other for the whole length of a generation. Same weights and dtype as the
stack's chat engine.

    python -m rag.baseline --model ~/.cache/rag-stack/models/qwen2.5-coder-0.5b-instruct --port 8200
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["main"]


class _Model:
    def __init__(self, path: str, dtype: str | None, threads: int, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        if dtype is None:  # the same choice the stack makes (bf16 on a GPU)
            from rag.stack.hardware import detect

            dtype = "bfloat16" if device == "cuda" else detect().dtype
        self.model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        self.model.to(device).eval()  # type: ignore[arg-type]
        self.lock = threading.Lock()  # the point of the baseline: one generation at a time

    def generate(
        self, messages: list[dict[str, str]], max_tokens: int, ignore_eos: bool, on_text: Any
    ) -> int:
        from transformers import TextIteratorStreamer

        encoded: Any = self.tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        # transformers 5 may return a BatchEncoding where 4 returned the tensor itself
        ids: Any = encoded if isinstance(encoded, self.torch.Tensor) else encoded["input_ids"]
        ids = ids.to(self.device)
        streamer = TextIteratorStreamer(self.tok, skip_prompt=True, skip_special_tokens=True)
        out: dict[str, Any] = {}
        kwargs = {
            "input_ids": ids,
            "attention_mask": self.torch.ones_like(ids),
            "max_new_tokens": max_tokens,
            "min_new_tokens": max_tokens if ignore_eos else 0,
            "do_sample": False,
            "streamer": streamer,
            "pad_token_id": self.tok.eos_token_id,
        }

        def run() -> None:
            with self.torch.inference_mode():
                out["seq"] = self.model.generate(**kwargs)

        with self.lock:
            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            for text in streamer:
                if text:
                    on_text(text)
            worker.join()
        return int(out["seq"].shape[1] - ids.shape[1])


def _handler(model: _Model, model_id: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model_id, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                messages = req["messages"]
            except (ValueError, KeyError) as exc:
                self._json(400, {"error": {"message": f"bad request: {exc}"}})
                return
            max_tokens = int(req.get("max_tokens") or 64)
            ignore_eos = bool(req.get("ignore_eos", False))
            rid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
            if not req.get("stream"):
                parts: list[str] = []
                n = model.generate(messages, max_tokens, ignore_eos, parts.append)
                self._json(
                    200,
                    {
                        "id": rid,
                        "object": "chat.completion",
                        "model": model_id,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "".join(parts)},
                                "finish_reason": "length",
                            }
                        ],
                        "usage": {"completion_tokens": n},
                    },
                )
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def send(obj: dict[str, Any] | str) -> None:
                payload = obj if isinstance(obj, str) else json.dumps(obj)
                data = f"data: {payload}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def chunk(text: str) -> None:
                send(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": model_id,
                        "choices": [{"index": 0, "delta": {"content": text}}],
                    }
                )

            n = model.generate(messages, max_tokens, ignore_eos, chunk)
            send(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "model": model_id,
                    "choices": [],
                    "usage": {"completion_tokens": n},
                }
            )
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve one model, one generation at a time, until interrupted."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="folder with config.json, weights and tokenizer")
    p.add_argument("--model-id", default="chat")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument(
        "--dtype", default=None, choices=["bfloat16", "float16", "float32"],
        help="default: what the CPU profile picks for this CPU (rag.stack.hardware)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    args = p.parse_args(argv)
    model = _Model(args.model, args.dtype, args.threads, args.device)
    # socketserver's listen backlog is 5: a sweep at 32 concurrent requests would be
    # refused at the door instead of queueing, which is what this baseline is about.
    ThreadingHTTPServer.request_queue_size = 256
    server = ThreadingHTTPServer((args.host, args.port), _handler(model, args.model_id))

    # Stop on SIGINT and SIGTERM even when started with SIGINT ignored (a background job).
    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"http://{args.host}:{args.port}/v1", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
