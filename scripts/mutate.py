"""Mutation testing of the decision core, the ingest store, the FPM schema and the perf model (`make mutate`).

Runs mutmut 3 on a scratch copy of the project (never on the working tree, which other people edit), one module
group after another (each group with the fast tests that cover it), then scores each module:
killed / (mutants run - the equivalent ones listed in docs/testing.md). Writes a JSON file (every module's score,
the commit it was measured on, and every surviving mutant's diff) and a Markdown report made from it.

    python scripts/mutate.py                                  # every scoped module, committed HEAD
    python scripts/mutate.py --files worker_shim/fpm.py --worktree   # one module, uncommitted edits included
    python scripts/mutate.py --sample 0                       # only mutants whose number ends in 0 (~10 %)
    python scripts/mutate.py --files 'planner/core/*' --merge # re-measure some modules, keep the others' results

Large modules run a fixed sample by default (SAMPLE below: 1 in 10 or 1 in 5) unless --full: a full run of
everything (~6,800 mutants) takes hours on the shared 2-core machine. The scratch copies sit in out/mutate/<group>/repo
(ignored by git); `cd` there and `mutmut show NAME` / `mutmut browse` inspects a run afterwards. Tests find
../shared from the checkout, so each scratch copy gets a `shared` link to the real one.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS_TESTING = ROOT / "docs" / "testing.md"


@dataclass(frozen=True)
class Group:
    """Modules mutated in one mutmut run, and the fast tests that exercise them. mutmut maps every mutated
    function to the tests that actually call it (its "stats" pass), so one mutant runs only the tests reaching it."""

    name: str
    modules: tuple[str, ...]  # globs
    tests: tuple[str, ...]  # globs; vllm-marked tests are deselected


GROUPS = (
    Group(
        "core",
        ("planner/core/*.py",),
        ("tests/core/test_*.py", "tests/planner/test_fleet_*.py"),
    ),
    Group(
        "store",
        ("planner/ingest/store.py", "planner/ingest/drops.py", "planner/ingest/slots.py", "planner/ingest/views.py"),
        (
            "tests/planner/test_fleet_*.py",
            "tests/planner/test_store_*.py",
            "tests/planner/test_ingest_*.py",
            "tests/planner/test_traffic_windows.py",  # the store feeds TrafficWindows
            "tests/core/test_core_reconcile.py",
            "tests/core/test_core_rows_reconcile.py",
            "tests/core/test_core_rows_threshold.py",
        ),
    ),
    Group(
        "fpm",
        ("worker_shim/fpm.py",),
        ("tests/worker_shim/test_fpm_*.py", "tests/planner/test_fleet_store.py", "tests/planner/test_store_rows.py"),
    ),
    Group(
        "perf_model",
        ("perf_model/*.py",),
        (
            "tests/perf_model/test_bench.py",
            "tests/perf_model/test_measured_profile.py",
            "tests/perf_model/test_model.py",
            "tests/perf_model/test_samples.py",
            "tests/perf_model/test_step_predictor.py",
            "tests/perf_model/test_step_timer.py",
            "tests/perf_model/test_*_rows.py",
            "tests/core/test_core_agg_latency.py",
        ),
    ),
)
# The default sample per module (mutants whose number ends in these digits; mutmut numbers them per function, so
# every function is sampled): 1 in 10 above ~400 mutants, 1 in 5 above ~150, every mutant below (counts of
# 2026-11-30; see docs/testing.md). --full runs them all; --sample DIGITS samples every module alike.
SAMPLE = {
    "planner/core/recommend.py": "0",
    "planner/core/step.py": "0",
    "planner/core/draft.py": "0",  # split out of step.py: the same pipeline, the same sample
    "planner/core/reconcile.py": "0",
    "planner/ingest/store.py": "0",
    "perf_model/model.py": "0",
    "perf_model/fit.py": "0",  # fit.py and predictions.py: split out of model.py, the same mutants and sample
    "perf_model/predictions.py": "0",
    "perf_model/bench.py": "0",
    "perf_model/step_timer.py": "0",
    "planner/core/config.py": "05",
    "planner/core/clamp.py": "05",
    "planner/ingest/slots.py": "05",
    "planner/core/forecast.py": "05",
    "planner/core/floor_stage.py": "05",  # ~420 mutants; measured at 1 in 5 since it was split out (docs/testing.md)
    "perf_model/profile.py": "05",
    "perf_model/synthetic.py": "05",
}
SOURCE_PACKAGES = ["planner", "worker_shim", "perf_model"]
ALSO_COPY = ["docs"]  # tests read docs/ (the reasons table) from the checkout
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
STATUS_BY_EXIT_CODE: dict[int | None, str] = {  # mutmut's own table (mutmut/stats.py)
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    35: "suspicious",
    36: "timeout",
    37: "caught by type check",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}
# docs/testing.md, table of equivalent mutants: | `name` | `a line the mutant adds` | why |
EQUIVALENT_ROW = re.compile(r"^\|\s*`(?P<name>[\w.]+__mutmut_\d+)`\s*\|\s*`(?P<text>[^`]+)`\s*\|\s*(?P<why>.+?)\s*\|$")


@dataclass
class ModuleScore:
    module: str
    commit: str
    source: str
    measured_utc: str
    sample: str | None  # digits the run mutants' numbers end in; None = every mutant
    mutants: int = 0
    killed: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    not_killed: dict[str, str] = field(default_factory=dict)  # name -> "[status]\n" + diff

    @property
    def equivalent_names(self) -> list[str]:
        """Not-killed mutants listed as equivalent in docs/testing.md (whose diff still adds the listed line)."""
        listed = load_equivalents()
        return [n for n, diff in self.not_killed.items() if n in listed and adds_line(diff, listed[n])]

    @property
    def equivalent(self) -> int:
        return len(self.equivalent_names)

    @property
    def survivors(self) -> dict[str, str]:
        excused = set(self.equivalent_names)
        return {n: diff for n, diff in self.not_killed.items() if n not in excused}

    @property
    def score_pct(self) -> float | None:
        scored = self.mutants - self.equivalent
        return None if scored == 0 else round(100.0 * self.killed / scored, 1)


def _glob(patterns: tuple[str, ...], root: Path = ROOT) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if path.name != "__init__.py" and rel not in found:
                found.append(rel)
    return found


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def make_scratch(work: Path, ref: str | None) -> Path:
    """A copy of the sources and tests in work/repo (from a commit, or the working tree), with ../shared linked."""
    if work.exists():
        shutil.rmtree(work)
    repo = work / "repo"
    repo.mkdir(parents=True)
    parts = [*SOURCE_PACKAGES, *ALSO_COPY, "tests", "pyproject.toml"]
    if ref is not None:
        with tempfile.TemporaryFile() as archive:
            subprocess.run(["git", "archive", "--format=tar", ref, *parts], cwd=ROOT, check=True, stdout=archive)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(repo, filter="data")
        for built in ROOT.glob("planner/ingest/*.so"):  # the compiled drain is built, not committed
            shutil.copy2(built, repo / built.relative_to(ROOT))
    else:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "mutants")
        for part in parts:
            src = ROOT / part
            if src.is_dir():
                shutil.copytree(src, repo / part, ignore=ignore)
            else:
                shutil.copy2(src, repo / part)
    shared = (ROOT.parent / "shared").resolve()
    if shared.exists():
        (repo / "shared").symlink_to(shared)  # tests read <checkout>/../shared; mutmut runs them from repo/mutants
    return repo


def write_config(repo: Path, files: list[str], tests: list[str]) -> None:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    with (repo / "pyproject.toml").open("a", encoding="utf-8") as f:
        f.write(
            "\n[tool.mutmut]\n"
            f"source_paths = {toml_list(SOURCE_PACKAGES)}\n"
            f"only_mutate = {toml_list(files)}\n"
            f"also_copy = {toml_list(ALSO_COPY)}\n"
            f"pytest_add_cli_args_test_selection = {toml_list(tests)}\n"
            'pytest_add_cli_args = ["-m", "not vllm", "-p", "no:cacheprovider"]\n'
            "use_git_change_detection = false\n"
        )


def load_equivalents() -> dict[str, str]:
    """Mutant name -> a line its diff must add (so a renumbered mutant is not excused by a stale entry)."""
    if not DOCS_TESTING.exists():
        return {}
    found: dict[str, str] = {}
    for line in DOCS_TESTING.read_text(encoding="utf-8").splitlines():
        m = EQUIVALENT_ROW.match(line.strip())
        if m:
            found[m["name"]] = m["text"]
    return found


def mutant_diff(mutmut: str, repo: Path, rel: str, name: str) -> str:
    """What ``mutmut show NAME`` prints, computed in this process (a subprocess per mutant costs seconds)."""
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant

        with contextlib.chdir(repo):
            return get_diff_for_mutant(name, path=Path(rel)).strip()
    except Exception:  # mutmut's internals moved: ask its command line
        out = subprocess.run([mutmut, "show", name], cwd=repo, capture_output=True, text=True)
        return out.stdout.strip()


def adds_line(diff: str, text: str) -> bool:
    return any(line.startswith("+") and text in line for line in diff.splitlines())


def natural_key(name: str) -> tuple[str, int]:
    base, _, num = name.rpartition("__mutmut_")
    return base, int(num) if num.isdigit() else 0


def score_module(repo: Path, rel: str, mutmut: str, template: ModuleScore) -> ModuleScore:
    score = template
    meta = repo / "mutants" / (rel + ".meta")
    if not meta.exists():
        return score
    exit_codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    for name, code in sorted(exit_codes.items(), key=lambda kv: natural_key(kv[0])):
        status = STATUS_BY_EXIT_CODE.get(code, "suspicious")
        if status == "not checked":  # outside the sample (or the run was cut short)
            continue
        score.mutants += 1
        score.by_status[status] = score.by_status.get(status, 0) + 1
        if status in KILLED:
            score.killed += 1
            continue
        score.not_killed[name] = f"[{status}]\n{mutant_diff(mutmut, repo, rel, name)}"
    return score


def module_name(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".")


def run_group(group: Group, files: list[str], args: argparse.Namespace, mutmut: str) -> list[ModuleScore]:
    tests = _glob(group.tests)
    ref = None if args.worktree else args.ref
    commit = git("rev-parse", "--short=12", args.ref if ref else "HEAD")
    source = (
        "commit"
        if ref
        else "working tree, uncommitted: "
        + (git("status", "--porcelain", "--", *files, *tests).replace("\n", "; ") or "none")
    )
    work = args.work / group.name
    repo = make_scratch(work, ref)
    # the tests the scratch copy holds (from a commit: an untracked test file in the working tree is not there,
    # and mutmut's first pass would fail on it)
    tests = _glob(group.tests, repo)
    write_config(repo, files, tests)
    samples: dict[str, str | None] = {}
    patterns = []
    for rel in files:
        sample = args.sample or (None if args.full else SAMPLE.get(rel))
        samples[rel] = sample
        patterns.append(f"{module_name(rel)}.*" + (f"__mutmut_*[{sample}]" if sample else ""))
    cmd = [mutmut, "run", "--max-children", str(args.jobs), *patterns]
    print(f"[{group.name}] mutating {len(files)} module(s) with {len(tests)} test file(s) in {repo}", flush=True)
    log = work / "mutmut.log"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    with log.open("w", encoding="utf-8") as out:
        returncode = subprocess.run(cmd, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if returncode != 0:
        print(log.read_text(encoding="utf-8")[-3000:], file=sys.stderr)
        raise SystemExit(f"mutmut failed ({returncode}); log in {log}")
    measured = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [score_module(repo, rel, mutmut, ModuleScore(rel, commit, source, measured, samples[rel])) for rel in files]


def to_json(score: ModuleScore) -> dict[str, object]:
    return {
        **asdict(score),
        "equivalent": score.equivalent_names,
        "survived": len(score.survivors),
        "score_pct": score.score_pct,
    }


def from_json(doc: dict[str, object]) -> ModuleScore:
    fields = {k: v for k, v in doc.items() if k not in ("score_pct", "survived", "equivalent")}
    return ModuleScore(**fields)  # type: ignore[arg-type]


def write_markdown(scores: list[ModuleScore], command: str, md_out: Path) -> None:
    lines = [
        "# Mutation testing results",
        "",
        "Made by `scripts/mutate.py` (how to read and re-run it: docs/testing.md). Score = killed / (mutants run -",
        "equivalent); `sample` = the last digits of the mutants run in a module (blank: all of them).",
        f"Last command: `{command}`.",
        "",
        "| module | commit | measured | sample | mutants | killed | equivalent | survived | score |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in scores:
        pct = "n/a" if s.score_pct is None else f"{s.score_pct} %"
        sample = f"…[{s.sample}]" if s.sample else ""
        lines.append(
            f"| {s.module} | `{s.commit}` | {s.measured_utc} | {sample} | {s.mutants} | {s.killed} | {s.equivalent}"
            f" | {len(s.survivors)} | {pct} |"
        )
    lines += ["", "## Surviving mutants", ""]
    survivors = [(s.module, name, diff) for s in scores for name, diff in s.survivors.items()]
    if not survivors:
        lines.append("None.")
    for _, name, diff in survivors:
        lines += [f"### `{name}`", "", "```diff", diff, "```", ""]
    md_out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="*", help="globs of scoped modules to mutate (default: all in scope)")
    parser.add_argument("--sample", help="run only mutants whose number ends in one of these digits, e.g. 0 or 37")
    parser.add_argument("--full", action="store_true", help="no default sample for the large modules")
    parser.add_argument("--worktree", action="store_true", help="copy the working tree instead of a commit")
    parser.add_argument("--ref", default="HEAD", help="commit to measure (default HEAD)")
    parser.add_argument("--jobs", type=int, default=1, help="mutmut worker processes (default 1: shared machine)")
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "mutate")
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "mutate" / "results.json")
    parser.add_argument("--md", type=Path, help="also write a Markdown report with every survivor's diff")
    parser.add_argument("--merge", action="store_true", help="keep the --json file's results for other modules")
    parser.add_argument(
        "--rescore", action="store_true", help="run nothing: re-read --json with the current equivalent-mutant table"
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        help="run nothing: merge these result files (groups run in parallel) into --json",
    )
    parser.add_argument("--fail-under", type=float, help="exit 1 if a module measured now scores below this %%")
    args = parser.parse_args(argv)
    command = " ".join(["python scripts/mutate.py", *(argv if argv is not None else sys.argv[1:])])

    mutmut = str(Path(sys.executable).with_name("mutmut"))
    measured: list[ModuleScore] = []
    if args.combine:
        docs = [json.loads(p.read_text(encoding="utf-8")) for p in args.combine]
        measured = [from_json(m) for d in docs for m in d["modules"]]
        command = " ; ".join(d["command"] for d in docs)
    elif args.rescore:
        args.merge = True
        measured = [from_json(m) for m in json.loads(args.json.read_text(encoding="utf-8"))["modules"]]
        command = json.loads(args.json.read_text(encoding="utf-8"))["command"]
    for group in GROUPS if not (args.rescore or args.combine) else ():
        files = [
            rel
            for rel in _glob(group.modules)
            if not args.files or any(fnmatch.fnmatch(rel, pattern) for pattern in args.files)
        ]
        if files:
            measured += run_group(group, files, args, mutmut)
    if not measured:
        parser.error(f"no scoped module matches {args.files}")

    by_module: dict[str, ModuleScore] = {}
    if args.merge and args.json.exists():
        by_module = {m["module"]: from_json(m) for m in json.loads(args.json.read_text(encoding="utf-8"))["modules"]}
    by_module.update({s.module: s for s in measured})
    order = [rel for group in GROUPS for rel in _glob(group.modules)]
    scores = sorted(by_module.values(), key=lambda s: order.index(s.module) if s.module in order else len(order))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "modules": [to_json(s) for s in scores]}
    args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.md:
        write_markdown(scores, command, args.md)

    width = max(len(s.module) for s in measured)
    print(f"{'module'.ljust(width)}  commit        sample  mutants  killed  equiv  survived  score")
    for s in measured:
        pct = "n/a" if s.score_pct is None else f"{s.score_pct:.1f} %"
        print(
            f"{s.module.ljust(width)}  {s.commit}  {(s.sample or 'all'):>6}  {s.mutants:7d}  {s.killed:6d}"
            f"  {s.equivalent:5d}  {len(s.survivors):8d}  {pct}"
        )
    print(f"results: {args.json}" + (f", {args.md}" if args.md else ""))
    if args.fail_under is not None:
        low = [s for s in measured if s.score_pct is not None and s.score_pct < args.fail_under]
        if low:
            print(f"below {args.fail_under} %: " + ", ".join(s.module for s in low), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
