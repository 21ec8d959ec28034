"""`rag eval`: measure retrieval and answers on a QA file, attribution on labeled
sentences, or the guard on labeled requests.

Each result goes to a JSON-lines file as it comes (`_Results`), so a long run that
is interrupted keeps what it measured; rag/evaluate.py and rag/guard_eval.py measure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import click

from rag.cli.common import (
    CONTEXT,
    build_settings,
    err,
    friendly,
    main,
    open_pipeline,
    progress,
    stack_options,
)
from rag.client import StackClient
from rag.errors import ConfigError
from rag.pipeline import Pipeline
from rag.settings import Settings

__all__ = ["evaluate"]


@main.command("eval", context_settings=CONTEXT)
@click.argument("qa_file", type=click.Path(path_type=Path))
@stack_options
@click.option("-k", "k", type=click.IntRange(1), default=5, show_default=True, help="Cut-off for recall@k.")
@click.option(
    "--answers/--no-answers", default=True, show_default=True, help="Also generate answers (slow on CPU)."
)
@click.option(
    "--attribution",
    is_flag=True,
    help="QA_FILE holds hand-labeled answer sentences (eval/attribution-*.jsonl): report how the "
    "attribution rule agrees with the labels, over --index's corpus.",
)
@click.option(
    "--guard",
    is_flag=True,
    help="QA_FILE (or a folder of them, e.g. eval/guard) holds requests and answers labeled harmless or "
    "harmful: report the guard's false- and true-positive rates per stage, ROC AUC and the threshold curve.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Where each question's result goes, as it comes [default: .rag/eval/QA_FILE_STEM.jsonl].",
)  # fmt: skip
@friendly
def evaluate(
    qa_file: Path,
    base_url: str | None,
    api_key: str | None,
    index_dir: Path | None,
    k: int,
    answers: bool,
    attribution: bool,
    guard: bool,
    as_json: bool,
    out: Path | None,
) -> None:
    """Measure retrieval (recall@k, MRR) and answers (keywords, sources, guard blocks), or the guard.

    QA_FILE is JSON lines: {"question": ..., "files": [gold paths], "keywords": [...]}.
    Works on any index and QA file.

    Each question's result is appended to OUT.partial as soon as it is known;
    a finished run renames it to OUT (the last finished run's OUT stays until
    then). A question whose request fails (a timed-out engine, an error
    answer) is recorded with its error and the run goes on.

    \b
    Examples:
      rag eval eval/dev.jsonl
      rag eval my_qa.jsonl --no-answers --json
      rag eval my_qa.jsonl -o results/run1.jsonl
      rag eval eval/attribution-git.jsonl --attribution --index .rag/git-doc
      rag eval eval/guard-heldout --guard     # the guard on requests it was not trained on
    """
    from rag.evaluate import load_qa, run_eval

    s = build_settings(base_url, api_key, index_dir)
    out = out or s.index_dir.parent / "eval" / f"{qa_file.stem}{'-guard' if guard else ''}.jsonl"
    if attribution:
        _judge(s, qa_file, as_json)
        return
    if guard:
        _guard_eval(s, qa_file, as_json, out)
        return
    qas = load_qa(qa_file)
    with _Results(out) as record:
        client, pipe = open_pipeline(s)
        with client:
            report = run_eval(pipe, qas, k=k, answers=answers, progress=progress("questions"), record=record)
            record({"summary": {key: v for key, v in report.as_dict().items() if key != "per_question"}})
    if report.failed:
        err(
            f"{len(report.failed)} of {report.questions} questions failed (their errors are in {out}); "
            f"retrieval measures cover the other {report.completed}"
        )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    click.echo(
        f"{report.questions} questions; retrieval (top {s.top_k}, rerank of {s.retrieval} top {s.rerank_n}):"
    )
    click.echo(f"  {'mode':9} {'recall@1':>8} {f'recall@{k}':>9} {'MRR':>6}")
    for mode, st in report.retrieval.items():
        click.echo(f"  {mode:9} {st.recall(1):8.3f} {st.recall(k):9.3f} {st.mrr:6.3f}")
    if report.keyword_hit_rate is not None:
        d = report.as_dict()["answers"]

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{100 * v:.0f}%"

        click.echo(
            f"answers: expected keywords {pct(report.keyword_hit_rate)}; of {report.answered} answered, "
            f"{pct(d['answers_with_source_rate'])} carry a source, {pct(d['fallback_rate'])} fell back to a "
            f"quoted passage ({report.echoed} where the model wrote the prompt's example); "
            f"{report.unsourced} named an option or setting that no source holds, {report.looped} stopped "
            "in a loop; "
            f"sentences with a supporting source {pct(d['citation_recall'])} "
            f"({report.supported}/{report.claims}); attached sources on a gold page "
            f"{pct(report.citation_accuracy)}; not covered {report.not_covered}; "
            f"guard blocks: input {report.guard_blocks['input']}, output {report.guard_blocks['output']}; "
            f"seconds per answer p50 {d['seconds_p50']} / p95 {d['seconds_p95']}, first shown word "
            f"p50 {d['first_shown_p50']} / p95 {d['first_shown_p95']}"
        )


class _Results:
    """Each result appended to OUT.partial as it comes; OUT.partial renamed to OUT when the
    run finishes, so an interrupted run keeps what it measured and the last finished OUT."""

    def __init__(self, out: Path) -> None:
        self.out, self.partial = out, out.with_name(out.name + ".partial")
        self.sink: TextIO | None = (
            None  # opened with the first result: a run that fails at once writes nothing
        )

    def __enter__(self) -> Callable[[dict[str, Any]], None]:
        return self.record

    def record(self, row: dict[str, Any]) -> None:
        if self.sink is None:
            try:
                self.partial.parent.mkdir(parents=True, exist_ok=True)
                self.sink = self.partial.open("w", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(
                    f"cannot write results to {self.partial} ({exc.strerror}); pass --out PATH"
                ) from exc
            err(f"writing each result to {self.partial} as it comes")
        self.sink.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.sink.flush()

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self.sink is None:
            return
        self.sink.close()
        if exc_type is None:
            self.partial.replace(self.out)
            err(f"results: {self.out}")


def _judge(s: Settings, labeled_file: Path, as_json: bool) -> None:
    """`rag eval --attribution`: the attribution rule against a person's labels."""
    from rag.evaluate import judge_attribution, load_labeled

    labeled = load_labeled(labeled_file)
    client, pipe = open_pipeline(s)
    with client:
        report = judge_attribution(pipe, labeled).as_dict()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(
        f"{report['sentences']} labeled sentences ({report['labeled_supported']} supported by a source), "
        f"support threshold {s.support_threshold}: accuracy {report['accuracy']}, "
        f"sensitivity {report['sensitivity']}, specificity {report['specificity']}, "
        f"attached sources right {report['attached_precision']}, pair ROC AUC {report['pair_auc']:.3f}"
    )


def _guard_eval(s: Settings, cases_path: Path, as_json: bool, out: Path) -> None:
    """`rag eval --guard`: the guard's error rates per stage on labeled cases."""
    from rag.guard_eval import CURVE, load_guard_cases, run_guard_eval
    from rag.served import resolve

    cases = load_guard_cases(cases_path)
    client = StackClient(s, on_wait=err)
    with client, _Results(out) as record:
        s = resolve(s, client)
        pipe = Pipeline(s, client, index=None)  # type: ignore[arg-type]  # the guard needs no index
        report = run_guard_eval(
            pipe.guard, cases, guard_format=s.guard_format,
            thresholds={"input": s.guard_threshold("input"), "output": s.guard_threshold("output")},
            progress=progress("cases"), record=record,
        )  # fmt: skip
        record({"summary": report.as_dict()})
    d = report.as_dict()
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return

    def pct(v: float | None) -> str:
        return "  n/a" if v is None else f"{100 * v:5.1f}%"

    click.echo(f"guard `{s.guard_model}` ({d['guard_format']} format):")
    click.echo(f"  {'stage':7} {'threshold':>9} {'harmless blocked (FPR)':>23} {'harmful blocked (TPR)':>22} "
               f"{'ROC AUC':>8} {'s/check':>8}")  # fmt: skip
    for stage, r in d["stages"].items():
        st = report.stages[stage]
        fp = f"{st.false_positives}/{r['harmless']} {pct(r['false_positive_rate'])}"
        tp = f"{st.true_positives}/{r['harmful']} {pct(r['true_positive_rate'])}"
        auc = "n/a" if r["roc_auc"] is None else f"{r['roc_auc']:.3f}"
        seconds = r["seconds_p50"] or 0.0
        click.echo(f"  {stage:7} {d['thresholds'][stage]:9.2f} {fp:>23} {tp:>22} {auc:>8} {seconds:8.2f}")
    if d["guard_format"] == "score":
        click.echo("threshold curve: FPR / TPR if the stage blocked at P(unsafe) >= threshold")
        for i, t in enumerate(CURVE):
            points = {stage: r["curve"][i] for stage, r in d["stages"].items()}
            cells = [
                f"{stage} {pct(c['false_positive_rate'])} / {pct(c['true_positive_rate'])}"
                for stage, c in points.items()
            ]
            click.echo(f"  {t:4.2f}  " + "   ".join(cells))
    errs = [
        f"{stage} {kind} {c['blocked']}/{c['cases']}"
        for stage, r in d["stages"].items()
        for kind, c in r["blocked_by_kind"].items()
        if (c["blocked"] > 0 if kind.startswith("harmless/") else c["blocked"] < c["cases"])
    ]
    if errs:
        click.echo("where it errs (blocked/cases): " + "; ".join(errs))
