"""inference.yaml as pydantic models: its shape in one place, and errors that name the field.

`read` parses the file and returns a `DeployFile`, or raises ConfigError listing every
field that is wrong: where it is (`replicas.chat.max`), the value found, what is
allowed, and for a misspelt key the key it probably meant. `rag check`
(rag/stack/preflight.py) then applies the rules that need the serve module too, and the
serve module reads each role's replicas from here (`replicas_for`), so inference.yaml
is where a deploy says how many of each engine it wants.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from rag.errors import ConfigError
from rag.stack.profiles import ROLES

__all__ = ["DEFAULT_FILE", "DeployFile", "Replicas", "read", "replicas_for"]

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "inference.yaml"


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelBlock(_Block):
    module: str = Field(description="the serve module: a file under scripts/ that exports `app`")
    profile: Literal["cpu", "gpu"] = "gpu"


class Resources(_Block):
    gpu_memory_gib: PositiveFloat = 24.0  # one card's memory, what the shares split
    gpus: PositiveInt = 1  # cards of that size the deploy may use (rag check packs on paper)


class Vllm(_Block):
    """Mirrors the serve module's parallel sizes (rag check fails on a drift)."""

    tensor_parallel_size: PositiveInt | None = None
    pipeline_parallel_size: PositiveInt | None = None


class Replicas(_Block):
    """One role's replicas: Serve's autoscaler keeps between `min` and `max`, aiming at
    `target_ongoing_requests` in flight per replica.

    `resources`: custom Ray resources each replica asks for beside its CPU and its share
    of a card, e.g. `{chat_node: 1}`. Ray then places the role only on nodes that
    advertise the resource (`ray start --resources '{"chat_node": 1}'`), at most as many
    per node as it has: one per node spreads the replicas, so losing a node loses one.
    (Serve's own `max_replicas_per_node` is refused for engines, which Ray Serve LLM
    places in placement groups.)"""

    min: int = Field(default=1, ge=0)
    max: PositiveInt = 1
    target_ongoing_requests: PositiveFloat | None = None
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, value: dict[str, float]) -> dict[str, float]:
        builtin = sorted(set(value) & {"CPU", "GPU", "memory", "object_store_memory"})
        if builtin:
            raise ValueError(
                f"{', '.join(builtin)}: set by the serve module (a CPU and a card share per engine); "
                "name custom resources here, ones your nodes advertise with `ray start --resources`"
            )
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    def autoscaling_config(self, batch: int) -> dict[str, Any]:
        """Serve's autoscaling_config: fixed where min == max, else scaling on requests in
        flight, by default half an engine batch per replica."""
        out: dict[str, Any] = {"min_replicas": self.min, "max_replicas": self.max}
        if self.max > self.min or self.target_ongoing_requests is not None:
            out["target_ongoing_requests"] = self.target_ongoing_requests or max(1.0, batch / 2)
        return out


Role = Literal["chat", "guard", "embed", "score"]
assert set(Role.__args__) == set(ROLES)  # type: ignore[attr-defined]


class DeployFile(_Block):
    """The whole of inference.yaml."""

    name: str = ""
    description: str = ""
    model: ModelBlock
    resources: Resources = Resources()
    vllm: Vllm = Vllm()
    replicas: dict[Role, Replicas] = Field(default_factory=dict)

    def replicas_of(self, role: str) -> Replicas:
        """`role`'s replicas as declared; one fixed replica where it says nothing."""
        return next((r for name, r in self.replicas.items() if name == role), Replicas())


def read(path: Path) -> DeployFile:
    """Parse `path`; ConfigError with every wrong field, each saying what to write instead."""
    if not path.is_file():
        raise ConfigError(f"{path} not found; run from the repository root or pass --file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping with at least `model: {{module: ...}}`")
    try:
        return DeployFile.model_validate(raw)
    except ValidationError as exc:
        problems = [_explain(err) for err in exc.errors()]
        raise ConfigError(f"{path}: " + "; ".join(problems)) from None


def replicas_for(role: str, path: Path = DEFAULT_FILE) -> Replicas:
    """What inference.yaml asks for `role`; one fixed replica where it says nothing (or
    where there is no inference.yaml beside the code, as on a node that only serves)."""
    if not path.is_file():
        return Replicas()
    return read(path).replicas_of(role)


def _explain(err: Any) -> str:
    """One pydantic error as a sentence: the field, the value found, what is allowed."""
    where = ".".join(str(p) for p in err["loc"] if p != "[key]")  # a dict key's error: the key
    kind, found = err["type"], err.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(err["loc"][:-1])
        allowed = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1)
        hint = f" (did you mean `{'.'.join(map(str, (*err['loc'][:-1], close[0])))}`?)" if close else ""
        return f"unknown key `{where}`{hint}; allowed here: {', '.join(allowed)}"
    if kind == "missing":
        example = " (a file under scripts/, e.g. serve_module)" if where == "model.module" else ""
        return f"`{where}` is required{example}"
    if kind == "literal_error":
        allowed = err.get("ctx", {}).get("expected", "")
        what = "role" if err["loc"][-1] == "[key]" and err["loc"][0] == "replicas" else "value"
        return f"`{where}`: {found!r} is not a known {what}; use {allowed}"
    if kind == "value_error":
        return f"`{where or 'file'}`: {err['msg'].removeprefix('Value error, ')}"
    return f"`{where}`: {found!r} is not allowed ({err['msg'].lower()})"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that parses the mapping at `loc` (for a misspelt key's neighbours)."""
    model: type[BaseModel] = DeployFile
    for part in loc:
        if model is DeployFile and part == "replicas":
            return None if len(loc) == 1 else Replicas
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model
