"""results.json -> results.md: one table per scenario, the targets, the machine.

Kept apart from the measuring code so a results.json can be re-rendered
(`python -m tests.bench.report results.json`) when the write-up changes.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from tests.bench import offpeak
from tests.bench.targets import HOT_PATH, Results, Target, cell, evaluate, rps

SUBJECT_ORDER = (
    "direct",
    "nginx-proxy",
    "tokengate-1w",
    "tokengate-1w-info",
    "tokengate-1w-redis",
    "tokengate-2w",
    "floor-canned",
    "floor-relay",
    "litellm",
)


def _ms(us: float | None) -> str:
    return "" if us is None else f"{us / 1000:.2f}"


def _x(a: float | None, b: float | None) -> str:
    return f"{a / b:.3g}x" if a is not None and b else ""


def _num(x: Any, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


def _other_load(r: Results) -> str:
    loads = [
        float(row["other_cpu_util"])
        for phase in r.get("static", {}).values()
        if phase
        for row in phase["cells"]
        if "other_cpu_util" in row
    ]
    if not loads:
        return "not measured"
    mean = sum(loads) / len(loads)
    busy = sum(1 for v in loads if v >= 0.25)
    return (
        f"mean {mean:.2f}, max {max(loads):.2f} cores; {busy} of {len(loads)} static cells "
        "had >= 0.25 cores of outside load"
    )


def _meta(r: Results) -> list[str]:
    m = r["meta"]
    return [
        f"# tokengate benchmark, {m['started']}",
        "",
        f"- tokengate commit: {m.get('commit', 'unknown')}",
        f"- machine: `nproc` = {m['nproc']}, `os.cpu_count()` = {m['cpu_count']}, "
        f"{m['cpu_model']}, {m['mem_gib']} GiB RAM, {m['kernel']}",
        f"- load average before / after: {m['loadavg_before']} / {m['loadavg_after']}",
        f"- CPU used by processes outside the benchmark during the static cells: {_other_load(r)}",
        f"- CPU plan: {m['cpu_plan']}",
        f"- cells: {m['plan']['seconds']:g} s each "
        f"(warm-up {m['plan']['warmup']:g} s per subject), "
        f"concurrency {', '.join(map(str, m['plan']['levels']))}; wrk `-t1`",
        f"- versions: {', '.join(f'{k} {v}' for k, v in m['versions'].items())}",
        f"- wall time: {m['wall_s']:.0f} s "
        f"(LiteLLM install {m['litellm_install_s']:.0f} s, not counted)",
        f'- request body (every subject): `{m["body"]}` (streaming adds `"stream":true`)',
        "",
    ]


def _targets(targets: list[Target]) -> list[str]:
    rows = [[t.goal, t.verdict, _num(t.value, 4), t.margin, t.detail] for t in targets]
    return [
        "## Targets",
        "",
        *_table(["target", "verdict", "value", "margin", "numbers"], rows),
        "",
    ]


def _hot_path(targets: list[Target]) -> list[str]:
    """Issue 23's five targets, each as measured vs target, met or missed."""
    by_id = {t.id: t for t in targets}
    rows = [
        [
            t.goal,
            _num(t.value, 3),
            f"{'>=' if t.higher_is_better else '<='} {t.threshold:g}",
            t.met,
            t.detail,
        ]
        for t in (by_id[i] for i in HOT_PATH if i in by_id)
    ]
    return [
        "## The hot path (issue 23)",
        "",
        *_table(["target", "measured", "target", "", "numbers"], rows),
        "",
    ]


def _static_rows(r: Results, mode: str) -> list[list[str]]:
    phase = r["static"][mode]
    levels = sorted({row["c"] for row in phase["cells"]})
    rows = []
    for c in levels:
        nginx, litellm = rps(r, mode, "nginx-proxy", c), rps(r, mode, "litellm", c)
        for subject in SUBJECT_ORDER:
            row = cell(r, mode, subject, c)
            if row is None:
                continue
            rows.append(
                [
                    str(c),
                    subject,
                    _num(row["rps"]),
                    _ms(row["p50_us"]),
                    _ms(row["p99_us"]),
                    f"{row['status']} / {row['errors'] - row['status']}",
                    _x(row["rps"], nginx),
                    _x(row["rps"], litellm),
                    _num(row["subject_cpu_util"], 2),
                    _num(row["subject_cpu_us_per_req"]),
                    _num(row.get("busy_after_s"), 1),
                    _num(row.get("other_cpu_util"), 2),
                ]
            )
    return rows


_STATIC_NOTES = [
    "`subject CPU` is the cores the subject's own processes used during the cell (the "
    "upstream and wrk not included); `CPU µs/req` is that CPU per completed request, the "
    "figure least disturbed by a noisy machine. `busy after` is how long the subject kept "
    "a core busy after wrk stopped (answering requests whose client had left); the next "
    "cell waits for it. `other load` is machine-wide CPU used during the cell by "
    "processes outside the benchmark (this machine is shared): a high value marks a "
    "disturbed cell.",
]


def _static(r: Results, mode: str, title: str) -> list[str]:
    phase = r.get("static", {}).get(mode)
    if not phase:
        return []
    header = ["c", "subject", "req/s", "p50 ms", "p99 ms", "non-2xx / socket err"]
    header += ["x nginx-proxy", "x LiteLLM", "subject CPU (cores)", "CPU µs/req", "busy after s"]
    header.append("other load (cores)")
    out = [f"## {title}", "", *_table(header, _static_rows(r, mode)), "", *_STATIC_NOTES, ""]
    idle = phase.get("idle_cpu_cores", {})
    rss_rows = [
        [
            name,
            _num(v.get("start")),
            _num(v.get("after_last")),
            _num(v.get("peak")),
            _num(v.get("processes")),
            _num(idle.get(name), 3),
        ]
        for name, v in phase["rss_mib"].items()
    ]
    header = ["subject", "RSS at start", "RSS after its last cell", "peak RSS", "processes"]
    out += ["Memory (MiB, summed over the subject's processes) and idle CPU (cores):", ""]
    out += [*_table([*header, "idle CPU"], rss_rows), ""]
    for name, statuses in phase["gateway_statuses"].items():
        log = phase["gateway_logs"].get(name, {})
        redis = log.get("redis_up")
        out.append(
            f"- {name}: gateway-counted answers by status {statuses}; "
            f"log lines by level {log.get('by_level', {})}"
            + ("" if redis is None else f"; `tokengate_redis_up` at the end: {redis:g}")
        )
        out += [f"  - {line}" for line in log.get("first", [])]
    out += [f"- error: {e}" for e in phase["errors"]]
    return [*out, ""]


def _sim(r: Results) -> list[str]:
    sim = r.get("sim")
    if not sim:
        return []
    shape = sim["sim"]
    header = ["subject", "p50 ms", "p99 ms", "added p50 ms", "TTFT p50 ms", "TTFT p99 ms"]
    header += ["added TTFT p50 ms", "stream total p50 ms", "failures"]
    rows = []
    for name in SUBJECT_ORDER:
        row = sim["rows"].get(name)
        if row is None:
            continue
        st = row["stream"]
        rows.append(
            [
                name,
                _ms(row["c1"]["p50_us"]),
                _ms(row["c1"]["p99_us"]),
                _num(row["added_p50_ms"], 3),
                _num(st.get("ttft_p50_ms"), 2),
                _num(st.get("ttft_p99_ms"), 2),
                _num(row["added_ttft_p50_ms"], 3),
                _num(st.get("total_p50_ms"), 2),
                f"{row['c1']['errors']} / {st.get('failures')}",
            ]
        )
    title = (
        f"## Scenario sim: latency at c=1 (sim {shape['latency_ms']:g} ms to first byte, "
        f"{shape['tokens_per_sec']:g} tokens/s, {shape['reply_tokens']} tokens)"
    )
    return [title, "", *_table(header, rows), "", *[f"- error: {e}" for e in sim["errors"]], ""]


def _quota(r: Results) -> list[str]:
    q = r.get("quota")
    if not q:
        return []
    if "error" in q:
        return ["## Scenario quota", "", f"- error: {q['error']}", ""]
    p = q["plan"]
    out = [
        f"## Scenario quota: {p['oversubscription']:g}x oversubscribed for {p['seconds']:g} s "
        f"({p['rpm']} rpm, window {p['window_sec']:g} s, "
        f"max queue wait {p['max_queue_wait_ms']} ms)",
        "",
        f"- goodput: {q['goodput_in_window']:.1%} of what the quota allows during the load window "
        f"({q['quota_allows_in_window']:g} requests); {q['goodput_total']:.1%} until the last "
        f"answer at {q['last_ok_s']:g} s",
        f"- successful answers per 5 s: {q['ok_per_5s']}",
        f"- upstream 429s: {q['upstream_429']} (upstream statuses {q['upstream_statuses']})",
        f"- Jain's fairness index over the 3 equal `normal` keys: {q['jain_normal']} "
        f"(successes per key {q['ok_per_key']})",
        f"- gateway `tokengate_queue_wait_seconds` (all classes): {q['gateway_queue_wait']}",
        "",
    ]
    rows = [
        [
            cls,
            str(v["sent"]),
            str(v["statuses"]),
            _num(v["ok_p50_s"], 3),
            _num(v["ok_p99_s"], 3),
            _num(v["all_p99_s"], 3),
        ]
        for cls, v in q["per_class"].items()
    ]
    header = ["class", "sent", "answers", "p50 s (200s)", "p99 s (200s)", "p99 s (all)"]
    return [*out, *_table(header, rows), ""]


def _admission(r: Results) -> list[str]:
    a = r.get("admission")
    if not a:
        return []
    if "error" in a:
        return ["## Admission microbenchmark", "", f"- error: {a['error']}", ""]
    rows = [
        [
            name,
            _num(v["sequential_us"], 2),
            _num(v["sequential_x_none"], 2),
            _num(v["concurrent32_us"], 2),
            _num(v["concurrent64_us"], 2),
            _num(v["concurrent64_x_none"], 2),
            f"{v.get('concurrent32_fallbacks', 0)} / {v.get('concurrent64_fallbacks', 0)}",
        ]
        for name, v in a["stores"].items()
    ]
    header = ["store", "µs sequential", "x none", "µs at 32", "µs at 64", "x none (64)"]
    header.append("fallbacks to local (32 / 64)")
    out = ["## Admission microbenchmark (reserve + settle, in-process, uvloop)", ""]
    return [*out, *_table(header, rows), "", *[f"- {n}" for n in a.get("notes", [])], ""]


def _redis(r: Results) -> list[str]:
    s = r.get("redis")
    if not s:
        return []
    rows = [
        [
            name,
            _num(v["rps"]),
            _num(v.get("x_inprocess"), 3),
            _num(v["cpu_us_per_req"]),
            _num(v.get("redis_calls_per_request"), 3),
            _num(v.get("redis_commands_per_request"), 3),
            ", ".join(f"{k} {n:.3f}" for k, n in v.get("per_command", {}).items()),
            str(v["errors"]),
        ]
        for name, v in s["summary"].items()
    ]
    header = ["subject", "req/s (median)", "x in-process", "CPU µs/req", "Redis calls/req"]
    header += ["commands run/req", "per command", "errors"]
    title = f"## Scenario redis: limits shared through Redis, c={s['c']}, {s['rounds']} rounds"
    return [title, "", *_table(header, rows), ""]


def _throttle(r: Results) -> list[str]:
    t = r.get("throttle")
    if not t:
        return []
    lines = [
        "## Scenario throttle: 160 requests at 50/s against 10 per 1-s window",
        "",
        "| case | goodput | refused | upstream 429s | Jain (half / all) | makespan | x optimum |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, row in t.get("cases", {}).items():
        if "error" in row:
            lines.append(f"| {case} | error: {row['error']} | | | | | |")
            continue
        refused = ", ".join(f"{k}: {v}" for k, v in row["refused"].items()) or "none"
        lines.append(
            f"| {case} | {row['goodput']:.3f} | {refused} | {row['upstream_429']} "
            f"({row['upstream_429_share']:.1%}) | {row['jain_at_half']:.4f} / {row['jain']:.4f} "
            f"| {row['makespan_s']:.2f} s | {row['makespan_x_optimum']:.3f} |"
        )
    return [*lines, ""]


def _streams(r: Results) -> list[str]:
    s = r.get("streams")
    if not s:
        return []
    out = []
    chunk = s.get("chunk") or {}
    if chunk:
        sim = chunk["sim"]
        out += [
            f"## Scenario streams: CPU per SSE event ({chunk['events_per_answer']} events an "
            f"answer, one a {1000 / sim['tokens_per_sec']:g} ms, c={chunk['concurrency']}, "
            f"{chunk['rounds']} rounds)",
            "",
        ]
        rows = [
            [
                name,
                str(v["events_per_answer"]),
                str(v["answers"]),
                _num(v["cpu_us_per_chunk"], 2),
                ", ".join(_num(c["subject_cpu_util"], 2) for c in v["cells"]),
                ", ".join(_num(c["other_cpu_util"], 2) for c in v["cells"]),
            ]
            for name, v in chunk["rows"].items()
        ]
        header = ["subject", "events a client gets", "answers", "CPU µs per event"]
        out += [*_table([*header, "subject CPU (cores)", "other load (cores)"], rows), ""]
    held = s.get("open") or {}
    if held:
        out += [
            f"## Scenario streams: streams held open at once (a token every "
            f"{1 / held['sim']['tokens_per_sec']:g} s, held {held['hold_s']:g} s; tokengate with "
            f"{', '.join(f'{k}={v}' for k, v in held['env'].items())})",
            "",
        ]
        rows = [
            [
                name,
                f"{v['held_open']} / {v['streams']}",
                _num(v["seconds_to_open"], 1),
                _num(v["rss_before_mib"]),
                _num(v["rss_open_mib"]),
                _num(v["kib_per_stream"]),
                str(v["failures"]),
            ]
            for name, v in held["rows"].items()
        ]
        header = ["subject", "open", "s to open all", "RSS before MiB", "RSS open MiB"]
        out += [*_table([*header, "KiB per stream", "failures"], rows), ""]
    return out + [f"- error: {e}" for e in s.get("errors", [])] + [""]


def _affinity(r: Results) -> list[str]:
    a = r.get("affinity")
    if not a:
        return []
    p = a["plan"]
    lines = [
        f"## Scenario affinity: {p['sessions']} sessions x {p['turns']} turns, "
        f"{p['concurrency']} at a time, over {p['domains']} domains with their own caches",
        "",
        "| case | cached share | ideal share | x ideal | requests per domain | max / mean "
        "| placements | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, row in a.get("cases", {}).items():
        if "error" in row:
            lines.append(f"| {case} | error: {row['error']} | | | | | | |")
            continue
        served = ", ".join(f"{d}: {n}" for d, n in row["served"].items())
        placed = ", ".join(f"{k}: {v:g}" for k, v in row["outcomes"].items()) or "-"
        lines.append(
            f"| {case} | {row['cached_share']:.3f} | {row['ideal_share']:.3f} "
            f"| {row['share_of_ideal']:.3f} | {served} | {row['max_over_mean']:.3f} "
            f"| {placed} | {row['wall_s']:.1f} s |"
        )
    return [*lines, ""]


def render(results: Results) -> str:
    targets = evaluate(results)
    parts = [
        _meta(results),
        _hot_path(targets),
        _targets(targets),
        _static(results, "json", "Scenario static: non-streaming, static nginx upstream"),
        _static(results, "sse", "Scenario static: streaming (SSE), static nginx upstream"),
        _sim(results),
        _streams(results),
        _quota(results),
        _throttle(results),
        _admission(results),
        _redis(results),
        _affinity(results),
        offpeak.markdown(results),
    ]
    errors = results.get("errors", [])
    if errors:
        parts.append(["## Errors", "", *[f"- {e}" for e in errors], ""])
    return "\n".join(line for part in parts for line in part)


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    results = json.loads(path.read_text())
    path.with_suffix(".md").write_text(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
