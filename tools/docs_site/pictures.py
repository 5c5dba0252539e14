"""The site's pictures, drawn at build time: the package layers, the training flow, benchmark ratios.

The layer diagram is computed from the ``pyproject.toml`` of each distribution (its in-repo
dependencies), so it shows the graph as it is. The benchmark plots read the results file that the
benchmarks append to (``tools/bench/_common.ratio_line`` writes one JSON line per ratio when
``ACCEL_BENCH_RESULTS`` names a file; ``nox -s bench`` sets it to ``.bench-results.jsonl``).
"""

from __future__ import annotations

import html
import io
import json
import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH_RESULTS = ROOT / ".bench-results.jsonl"

_STYLE = (
    "<style>rect{fill:#eef3fb;stroke:#3f51b5;stroke-width:1.5}text{font:14px sans-serif;fill:#1a1a1a}"
    "text.small{font-size:11px;fill:#444}line,path{stroke:#5c6bc0;stroke-width:1.3;fill:none}"
    "@media (prefers-color-scheme: dark){rect{fill:#24283b}text{fill:#eee}text.small{fill:#bbb}}</style>"
    '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
    'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" style="fill:#5c6bc0;stroke:none"/></marker></defs>'
)


def _requires(packages: pathlib.Path) -> dict[str, list[str]]:
    graph: dict[str, list[str]] = {}
    for pyproject in sorted(packages.glob("*/pyproject.toml")):
        meta = tomllib.loads(pyproject.read_text())["project"]
        deps = [d.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for d in meta.get("dependencies", [])]
        graph[meta["name"]] = [d for d in deps if d.startswith("accel")]
    return graph


def _layers(graph: dict[str, list[str]]) -> dict[str, int]:
    depth: dict[str, int] = {}

    def level(name: str) -> int:
        if name not in depth:
            depth[name] = 1 + max((level(d) for d in graph.get(name, []) if d in graph), default=-1)
        return depth[name]

    for name in graph:
        level(name)
    return depth


def layers_svg(packages: pathlib.Path = ROOT / "packages") -> str:
    """SVG of the distributions in dependency layers (lowest at the bottom), an arrow per dependency."""
    graph = _requires(packages)
    depth = _layers(graph)
    rows: dict[int, list[str]] = {}
    for name in sorted(graph, key=lambda n: (depth[n], n)):
        rows.setdefault(depth[name], []).append(name)
    box_w, box_h, gap_x, gap_y = 150, 40, 30, 60
    width = max(len(r) for r in rows.values()) * (box_w + gap_x) + gap_x
    height = len(rows) * (box_h + gap_y) + gap_y
    where: dict[str, tuple[float, float]] = {}
    shapes = []
    for level, names in rows.items():
        y = height - gap_y - box_h - level * (box_h + gap_y) + 10
        row_w = len(names) * box_w + (len(names) - 1) * gap_x
        for index, name in enumerate(names):
            x = (width - row_w) / 2 + index * (box_w + gap_x)
            where[name] = (x, y)
            shapes.append(f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="6"/>')
            shapes.append(f'<text x="{x + box_w / 2}" y="{y + 25}" text-anchor="middle">{html.escape(name)}</text>')
    arrows = []
    for name, deps in graph.items():
        x, y = where[name]
        for dep in deps:
            if dep not in where:
                continue
            dx, dy = where[dep]
            arrows.append(
                f'<line x1="{x + box_w / 2}" y1="{y + box_h}" x2="{dx + box_w / 2}" y2="{dy}" marker-end="url(#arrow)"/>'
            )
    title = "accel's distributions; an arrow points from a package to one it depends on"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">'
        f"<title>{title}</title>{_STYLE}{''.join(arrows)}{''.join(shapes)}</svg>"
    )


#: The training flow of accel-train, top to bottom: (box, note under it).
FLOW = [
    ("Accelerator(...)", "a facade: no backend branches"),
    ("connector.build", "arguments + plugins + launcher environment, validated once"),
    ("strategy | precision", "strategies/: DDP, FSDP, DeepSpeed, ND mesh | precisions/: fp16, bf16, fp8"),
    ("prepare · backward · step", "the strategy wraps and syncs; the precision casts and scales"),
    ("checkpoint I/O", "save_state / load_state: documented layout, atomic, no pickle on load"),
]


def flow_svg() -> str:
    """SVG of the connector -> strategy / precision -> checkpoint flow of ``FLOW``."""
    box_w, box_h, gap = 300, 40, 46
    width, height = 720, len(FLOW) * (box_h + gap) + 10
    parts = []
    for index, (box, note) in enumerate(FLOW):
        y = 10 + index * (box_h + gap)
        left, right = box.split(" | ") if " | " in box else (box, None)
        if right is None:
            parts.append(f'<rect x="{(width - box_w) / 2}" y="{y}" width="{box_w}" height="{box_h}" rx="6"/>')
            parts.append(f'<text x="{width / 2}" y="{y + 25}" text-anchor="middle">{html.escape(left)}</text>')
        else:
            for column, label in ((0, left), (1, right)):
                x = width / 2 - box_w / 2 - 20 + column * (box_w / 2 + 40)
                parts.append(f'<rect x="{x}" y="{y}" width="{box_w / 2}" height="{box_h}" rx="6"/>')
                parts.append(f'<text x="{x + box_w / 4}" y="{y + 25}" text-anchor="middle">{html.escape(label)}</text>')
        parts.append(
            f'<text class="small" x="{width / 2}" y="{y + box_h + 15}" text-anchor="middle">{html.escape(note)}</text>'
        )
        if index + 1 < len(FLOW):
            parts.append(
                f'<line x1="{width / 2}" y1="{y + box_h + 20}" x2="{width / 2}" y2="{y + box_h + gap}" marker-end="url(#arrow)"/>'
            )
    title = "How accel-train turns a configuration into a training step and a checkpoint"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">'
        f"<title>{title}</title>{_STYLE}{''.join(parts)}</svg>"
    )


def read_results(path: pathlib.Path = BENCH_RESULTS) -> list[dict]:
    """The ratio records of the results file (the latest record of each script and label)."""
    if not path.exists():
        return []
    latest: dict[tuple[str, str], dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("ratio") is None:
                continue  # a zero baseline: no ratio to plot
            latest[(record["script"], record["label"])] = record
    return list(latest.values())


def ratio_plot(records: list[dict], title: str) -> bytes:
    """SVG bytes: one horizontal bar per ratio, a line at 1.0 (same speed as the baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sorted(records, key=lambda r: (r["script"], r["label"]))
    labels = [f"{r['script']}: {r['label']}" for r in records]
    ratios = [r["ratio"] for r in records]
    figure, axes = plt.subplots(figsize=(9, 0.32 * len(records) + 1.2))
    colours = ["#43a047" if _better_than_baseline(r) else "#e53935" for r in records]
    axes.barh(range(len(records)), ratios, color=colours)
    axes.set_xlim(0, max(2.0, max(ratios) * 1.05))
    axes.set_yticks(range(len(records)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.axvline(1.0, color="#333", linewidth=1)
    axes.set_xlabel("ratio (accel / baseline; green: better than the baseline, below 1 for time and memory)")
    axes.set_title(title, fontsize=10)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    return buffer.getvalue()


#: Benchmarks that measure a GPU and record nothing without one (the page names them while unmeasured).
GPU_BENCHMARKS = {
    "gpu_train_loop": "steps/s of a prepared loop against plain PyTorch on one GPU (no, bf16, fp16)",
}


def _higher_is_better(record: dict) -> bool:
    """A rate (steps/s, tokens/s, samples/s) or a goal written ``>= x``: the bigger ratio is the better one."""
    return str(record.get("goal", "")).lstrip().startswith(">") or "/s" in str(record.get("unit", ""))


def _better_than_baseline(record: dict) -> bool:
    return record["ratio"] >= 1.0 if _higher_is_better(record) else record["ratio"] <= 1.0


def _meets(record: dict) -> str:
    """``yes`` / ``no`` against a goal ``<= x`` or ``>= x``; empty without one."""
    goal = str(record.get("goal", "")).replace(" ", "")
    for sign, holds in (("<=", lambda r, g: r <= g), (">=", lambda r, g: r >= g)):
        if goal.startswith(sign):
            try:
                return "yes" if holds(record["ratio"], float(goal[2:].rstrip("x\N{MULTIPLICATION SIGN}"))) else "no"
            except ValueError:
                return ""
    return ""


def _machine_line(records: list[dict]) -> str:
    """Where and when the figures were measured, from the records' ``machine`` and ``time`` fields."""
    machines = {json.dumps(r["machine"], sort_keys=True) for r in records if r.get("machine")}
    times = sorted(r["time"] for r in records if r.get("time"))
    when = "" if not times else f" at {times[0]}" if times[0] == times[-1] else f" between {times[0]} and {times[-1]}"
    if len(machines) != 1:
        return f"Measured{when} on {'several machines' if machines else 'a machine the records do not describe'}."
    machine = json.loads(machines.pop())
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"
    return (
        f"Measured{when} on {machine.get('cores')} CPU cores ({machine.get('cpu')}){gpu}, "
        f"{machine.get('system')}, Python {machine.get('python')}, torch {machine.get('torch')}, "
        f"accel {machine.get('accel')}."
    )


def _value(number: object, unit: str) -> str:
    return f"{number:.4g} {unit}".strip() if isinstance(number, (int, float)) else ""


def results_table(records: list[dict]) -> str:
    """Markdown table of every ratio: benchmark, row, accel's figure, the baseline's, ratio, goal, met,
    and whether it ran on a GPU (a row without one is a CPU figure)."""
    rows = [
        "| benchmark | row | measured | baseline | ratio | goal | met | device |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: (r["script"], r["label"])):
        device = "GPU" if (r.get("machine") or {}).get("gpu") else "CPU"
        unit = r.get("unit", "")
        # the reference release's own figures: the goal printed beside them is accel's, not theirs
        goal, met = ("", "") if r["label"].lstrip().startswith("reference") else (r.get("goal", ""), _meets(r))
        cells = [
            f"`{r['script']}`", r["label"].replace("|", "\\|"), _value(r.get("value"), unit),
            _value(r.get("baseline"), unit), f"{r['ratio']:.3f}", goal, met, device,
        ]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _unmeasured_gpu(records: list[dict]) -> list[str]:
    measured = {r["script"] for r in records if (r.get("machine") or {}).get("gpu")}
    return [f"`tools/bench/{name}.py`: {what}" for name, what in GPU_BENCHMARKS.items() if name not in measured]


def benchmark_files(path: pathlib.Path = BENCH_RESULTS) -> tuple[str, dict[str, bytes]]:
    """Markdown of the benchmarks section and the plot files it shows (none when there are no results)."""
    records = read_results(path)
    if not records:
        return (
            f"No benchmark results were found when this site was built (`{path.name}` is written by "
            "`nox -s bench`), so there is no plot here. Run the benchmarks, then build the site again.\n",
            {},
        )
    # "accel vs reference" lines compare with the reference release; lines about the reference alone
    # ("reference ... vs plain") are its own figures, not accel's, and are left out
    against_reference = [r for r in records if "reference" in r["label"] and not r["label"].startswith("reference")]
    against_plain = [r for r in records if "reference" not in r["label"]]
    files: dict[str, bytes] = {}
    text = [f"{len(records)} ratios from `{path.name}`, as the benchmarks printed them. {_machine_line(records)}", ""]
    for name, subset, title in (
        ("bench-vs-plain.svg", against_plain, "accel against plain PyTorch (or the stated baseline)"),
        ("bench-vs-reference.svg", against_reference, "accel against the reference Accelerate release"),
    ):
        if subset:
            files[f"images/{name}"] = ratio_plot(subset, title)
            text += [f"![{title}](images/{name})", ""]
    text += ["Every row (the device column says where it ran):", "", results_table(records), ""]
    unmeasured = _unmeasured_gpu(records)
    if unmeasured:
        text += ["Not measured in these results (no GPU on the machine that ran them):", ""]
        text += [f"- {line}" for line in unmeasured] + [""]
    return "\n".join(text), files
