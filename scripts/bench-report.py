#!/usr/bin/env python3
"""bench-report.py: turn the records of scripts/bench-report.sh into the
side-by-side report (Markdown) and the chart's data file (for
scripts/bench-report.gp).

Usage: bench-report.py [--machine TEXT] RESULTS.jsonl REPORT.md CHART.dat

Every record is one run: {scenario, peer, version, durability, date,
command, pinned, broker_cpu_s, rss_before_kib, rss_after_kib, rss_peak_kib,
result} where result is the JSON of `ferrymq bench mqtt|core --json` (or,
for fanin-clients-*, the script's own summary of mosquitto_pub/_sub), plus
optional fields: goroutines_before/_holding, os_threads_before/_holding
and transport (idle scenarios), auth (connect-auth), cpu_profile and
cpu_top (latency, ferrymq), and na: the reason a broker cannot run the
scenario (its row then says so; no numbers).
Each scenario has one headline metric; every row shows the ratio of
ferrymq's headline to that broker's, oriented so that > 1 means ferrymq is
ahead (for "lower is better" metrics the ratio is theirs over ferrymq's).
"""

import argparse
import json
import sys

ORDER = ["ferrymq", "ferrymq-async", "mosquitto", "mosquitto-unlimited", "nats", "nats-sync", "mochi"]
FERRY = "ferrymq"


def lat(us):
    if us is None or us == 0:
        return "–"
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1e6:
        return f"{us / 1000:.3g} ms"
    return f"{us / 1e6:.3g} s"


def num(v, digits=0):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def pct(v):
    return "–" if v is None else f"{v:.2f} %"


def cpu_per_m(rec, msgs):
    return None if not msgs else rec["broker_cpu_s"] / (msgs / 1e6)


def mqtt(rec):
    return rec["result"].get("mqtt") or {}


def delivered(rec):
    return mqtt(rec).get("received", 0)


# Each scenario: title, what was run (words), headline (name, function of a
# record, higher_is_better, formatter) and the table's columns.
def goroutines(r):
    a, b = r.get("goroutines_before"), r.get("goroutines_holding")
    if a is None and b is None:
        return "n/a"
    return f"{num(a)} → {num(b)}"


def scen_idle(title="Idle memory per connection"):
    def kib_per_conn(r):
        held = r["result"]["conns"]["held"]
        return (r["rss_after_kib"] - r["rss_before_kib"]) / held if held else None

    return lambda: dict(
        title=title,
        headline=("KiB per connection", kib_per_conn, False, lambda v: f"{v:.2f} KiB"),
        cols=[
            ("held", lambda r: num(r["result"]["conns"]["held"])),
            ("alive at the end", lambda r: num(r["result"]["conns"]["alive"])),
            ("RSS before", lambda r: f"{r['rss_before_kib'] / 1024:.1f} MiB"),
            ("RSS holding", lambda r: f"{r['rss_after_kib'] / 1024:.1f} MiB"),
            ("KiB / conn", lambda r: f"{kib_per_conn(r):.2f}"),
            ("per 1M conns", lambda r: f"{kib_per_conn(r) * 1e6 / 1024 / 1024:.1f} GiB"),
            ("goroutines before → holding", goroutines),
            ("OS threads before → holding", lambda r: f"{num(r.get('os_threads_before'))} → {num(r.get('os_threads_holding'))}"),
        ],
    )


def scen_connect(title="Connect storm"):
    c = lambda r: r["result"]["conns"]
    return lambda: dict(
        title=title,
        headline=("connections/s", lambda r: c(r)["per_sec"], True, lambda v: f"{v:,.0f}/s"),
        cols=[
            ("connected", lambda r: num(c(r)["connected"])),
            ("failed", lambda r: num(c(r)["failed"])),
            ("conns/s", lambda r: num(c(r)["per_sec"])),
            ("CONNACK p50", lambda r: lat(c(r)["latency"]["p50_us"])),
            ("p99", lambda r: lat(c(r)["latency"]["p99_us"])),
            ("p99.9", lambda r: lat(c(r)["latency"]["p999_us"])),
            ("broker CPU s", lambda r: f"{r['broker_cpu_s']:.2f}"),
            ("CPU ms / conn", lambda r: f"{r['broker_cpu_s'] * 1000 / max(1, c(r)['connected']):.3f}"),
            ("auth", lambda r: r.get("auth") or "none"),
        ],
    )


def scen_fanin_clients(qos):
    """mosquitto_pub -l × N into one mosquitto_sub -t '#' (the script's summary)."""
    return lambda: dict(
        title=f"QoS {qos} fan-in with mosquitto_pub -l / mosquitto_sub",
        headline=("delivered/s", lambda r: mqtt(r).get("per_sec"), True, lambda v: f"{v:,.0f}/s"),
        cols=[
            ("sent", lambda r: num(r["result"]["sent"])),
            ("delivered", lambda r: num(delivered(r))),
            ("lost (loss)", lambda r: f"{num(mqtt(r).get('lost'))} ({pct(mqtt(r).get('loss_pct'))})"),
            ("dups", lambda r: num(mqtt(r).get("duplicates"))),
            ("publishers done after", lambda r: f"{r['result']['publish_seconds']:.2f} s"),
            ("last arrival after", lambda r: f"{r['result']['seconds']:.2f} s"),
            ("delivered/s", lambda r: num(mqtt(r).get("per_sec"))),
            ("CPU s / M delivered", lambda r: num(cpu_per_m(r, delivered(r)), 1)),
        ],
    )


def pubsub_cols(per="published"):
    def cpu(r):
        msgs = r["result"]["acked"] if per == "published" else delivered(r)
        return cpu_per_m(r, msgs)

    return [
        ("acked/s", lambda r: num(r["result"]["acked_per_sec"])),
        ("delivered/s", lambda r: num(mqtt(r).get("per_sec"))),
        ("lost (loss)", lambda r: f"{num(mqtt(r).get('lost'))} ({pct(mqtt(r).get('loss_pct'))})"),
        ("dups", lambda r: num(mqtt(r).get("duplicates"))),
        ("e2e p50", lambda r: lat(mqtt(r).get("latency", {}).get("p50_us"))),
        ("e2e p99", lambda r: lat(mqtt(r).get("latency", {}).get("p99_us"))),
        ("ack p99", lambda r: lat((r["result"].get("ack_latency") or {}).get("p99_us"))),
        (f"CPU s / M {per}", lambda r: num(cpu(r), 1)),
    ]


def scen_pubsub(title, name, value, per="published"):
    """A publish/subscribe scenario whose headline is a rate."""
    return lambda: dict(
        title=title,
        headline=(name, value, True, lambda v: f"{v:,.0f}/s"),
        cols=pubsub_cols(per),
    )


def scen_latency():
    l = lambda r, q: mqtt(r).get("latency", {}).get(q)
    core = lambda r: r["result"].get("core") or {}
    return dict(
        title="End-to-end latency at a fixed rate",
        headline=("e2e p99", lambda r: l(r, "p99_us"), False, lat),
        cols=[
            ("delivered", lambda r: num(delivered(r))),
            ("lost", lambda r: num(mqtt(r).get("lost"))),
            ("e2e p50", lambda r: lat(l(r, "p50_us"))),
            ("e2e p99", lambda r: lat(l(r, "p99_us"))),
            ("e2e p99.9", lambda r: lat(l(r, "p999_us"))),
            ("ack p99", lambda r: lat((r["result"].get("ack_latency") or {}).get("p99_us"))),
            ("→ core consumer p50 / p99 / p99.9", lambda r: " / ".join(lat(core(r).get("latency", {}).get(q)) for q in ("p50_us", "p99_us", "p999_us")) if core(r) else "–"),
            ("CPU s / M published", lambda r: num(cpu_per_m(r, r["result"]["acked"]), 1)),
        ],
    )


BY = {}


def slow_ratio(r):
    """The healthy subscriber's p99 over the same broker's p99 in the
    latency run (same load, no slow subscriber): what the slow one costs."""
    alone = BY.get("latency", {}).get(r["peer"])
    a = mqtt(alone).get("latency", {}).get("p99_us") if alone else None
    b = mqtt(r).get("latency", {}).get("p99_us")
    return None if not a or not b else b / a


def slow_vs_alone(r):
    v = slow_ratio(r)
    return "–" if v is None else f"{v:.2f}×"


def scen_slow():
    l = lambda r, q: mqtt(r).get("latency", {}).get(q)
    grew = lambda r: (r["rss_after_kib"] - r["rss_before_kib"]) / 1024
    return dict(
        title="Slow-consumer isolation",
        headline=("healthy subscriber's p99 with a slow one ÷ without", slow_ratio, False, lambda v: f"{v:.2f}×"),
        cols=[
            ("healthy: delivered", lambda r: num(delivered(r))),
            ("healthy: lost", lambda r: num(mqtt(r).get("lost"))),
            ("healthy: e2e p50", lambda r: lat(l(r, "p50_us"))),
            ("healthy: e2e p99", lambda r: lat(l(r, "p99_us"))),
            ("healthy: e2e p99.9", lambda r: lat(l(r, "p999_us"))),
            ("ack p99", lambda r: lat((r["result"].get("ack_latency") or {}).get("p99_us"))),
            ("p99 ÷ its own p99 without the slow one (latency run)", lambda r: slow_vs_alone(r)),
            ("slow ones cut off", lambda r: f"{r['result'].get('slow_disconnected', 0)} of {r['result'].get('slow_subscribers', 0)}"),
            ("broker RSS growth", lambda r: f"{grew(r):+.1f} MiB"),
        ],
    )


def scen_ordered():
    res = lambda r: r["result"]
    return dict(
        title="Ordered consumption",
        headline=("messages/s consumed in order", lambda r: res(r)["msgs_per_sec"], True, lambda v: f"{v:,.0f}/s"),
        cols=[
            ("consumers", lambda r: num(res(r).get("consumers"))),
            ("first delivery after", lambda r: f"{res(r).get('first_ms', 0):.0f} ms"),
            ("messages", lambda r: num(res(r)["messages"])),
            ("msgs/s (from the first delivery)", lambda r: num(res(r)["msgs_per_sec"])),
            ("out of order", lambda r: num(res(r).get("out_of_order", 0))),
            ("duplicates", lambda r: num(res(r).get("duplicates", 0))),
            ("CPU s / M consumed (fill and consume)", lambda r: num(cpu_per_m(r, res(r)["messages"]), 1)),
        ],
    )


SCENARIOS = {
    "idle-mem": scen_idle(),
    "idle-mem-sub": scen_idle("Idle memory per connection with one subscription"),
    "idle-mem-tls": scen_idle("Idle memory per TLS connection"),
    "idle-mem-ws": scen_idle("Idle memory per WebSocket connection"),
    "connect": scen_connect(),
    "connect-auth": scen_connect("Connect storm with authentication"),
    "fanin-qos0": scen_pubsub("QoS 0 fan-in", "delivered/s", lambda r: mqtt(r).get("per_sec")),
    "fanin-qos1": scen_pubsub("QoS 1 fan-in", "acknowledged/s", lambda r: r["result"]["acked_per_sec"]),
    "fanin-clients-qos0": scen_fanin_clients(0),
    "fanin-clients-qos1": scen_fanin_clients(1),
    "fanout": scen_pubsub("Fan-out 1 → N", "deliveries/s", lambda r: mqtt(r).get("per_sec"), "delivered"),
    "p2p": scen_pubsub("Point-to-point (pairs)", "delivered/s", lambda r: mqtt(r).get("per_sec")),
    "latency": scen_latency,
    "slow": scen_slow,
    "ordered": scen_ordered,
}


def advantage(ferry, other, higher_better):
    """> 1: ferrymq ahead."""
    if ferry is None or other is None or ferry <= 0 or other <= 0:
        return None
    return ferry / other if higher_better else other / ferry


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", default="")
    ap.add_argument("results")
    ap.add_argument("report")
    ap.add_argument("chart")
    a = ap.parse_args()

    recs = [json.loads(l) for l in open(a.results) if l.strip()]
    by = {}
    for r in recs:
        by.setdefault(r["scenario"], {})[r["peer"]] = r
    BY.update(by)
    peers = sorted({r["peer"] for r in recs}, key=lambda p: ORDER.index(p) if p in ORDER else 99)
    others = [p for p in peers if p != FERRY]

    out = []
    w = out.append
    dates = sorted({r["date"] for r in recs})
    pinned = all(r.get("pinned") for r in recs if not r.get("na"))  # an n/a row ran nothing
    w(f"Run {', '.join(dates)} on {a.machine or 'this machine'}; loopback only; "
      + ("each broker pinned to CPU 0 and the load generator (`ferrymq bench`) to CPU 1." if pinned else "not pinned."))
    w("")
    w("| broker | version | durability as run |")
    w("|---|---|---|")
    seen = set()
    for r in sorted(recs, key=lambda r: ORDER.index(r["peer"]) if r["peer"] in ORDER else 99):
        if r["peer"] in seen:
            continue
        seen.add(r["peer"])
        w(f"| {r['peer']} | {r['version']} | {r['durability']} |")
    w("")

    # Summary: one line per scenario, headline values and ratios.
    w("### Summary")
    w("")
    w("Headline of each scenario; **ratio = how far ferrymq is ahead of that broker** (> 1: ferrymq better,"
      " < 1: worse; for latency and memory the other's value over ferrymq's). Each links to its section.")
    w("")
    w("| scenario | headline | " + " | ".join(peers) + " | " + " | ".join(f"ferrymq vs {p}" for p in others) + " |")
    w("|---|---|" + "---:|" * len(peers) + "---:|" * len(others))
    chart = []
    for key, mk in SCENARIOS.items():
        if key not in by:
            continue
        s = mk()
        name, f, hb, fmt = s["headline"]
        vals = {}
        for p in peers:
            r = by[key].get(p)
            try:
                vals[p] = f(r) if r and not r.get("na") else None
            except (KeyError, TypeError, ZeroDivisionError):
                vals[p] = None
        anchor = key
        cells = [fmt(vals[p]) if vals[p] is not None else ("n/a" if by[key].get(p, {}).get("na") else "–") for p in peers]
        ratios = [fmt_ratio(advantage(vals.get(FERRY), vals[p], hb)) for p in others]
        w(f"| [{s['title']}](#{anchor}) | {name} ({'higher' if hb else 'lower'} is better) | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        # chart: each broker's score relative to ferrymq, higher = better
        row = [key]
        for p in peers:
            v, fv = vals[p], vals.get(FERRY)
            if v is None or fv is None or v <= 0 or fv <= 0:
                row.append("NaN")
            else:
                row.append(f"{(v / fv) if hb else (fv / v):.4f}")
        chart.append(row)
    # CPU per million messages, from the QoS 1 fan-in
    if "fanin-qos1" in by:
        vals = {p: cpu_per_m(by["fanin-qos1"][p], by["fanin-qos1"][p]["result"]["acked"]) if p in by["fanin-qos1"] else None for p in peers}
        w("| [Broker CPU per million messages](#fanin-qos1) | CPU s per M msgs, QoS 1 fan-in (lower is better) | "
          + " | ".join(num(vals[p], 1) for p in peers) + " | "
          + " | ".join(fmt_ratio(advantage(vals.get(FERRY), vals[p], False)) for p in others) + " |")
        row = ["cpu/M"]
        for p in peers:
            v, fv = vals[p], vals.get(FERRY)
            row.append("NaN" if not v or not fv else f"{fv / v:.4f}")
        chart.append(row)
    w("")

    for key, mk in SCENARIOS.items():
        if key not in by:
            continue
        s = mk()
        name, f, hb, fmt = s["headline"]
        w(f'<a id="{key}"></a>')
        w("")
        w(f"### {s['title']}")
        w("")
        head = ["broker", "durability"] + [c[0] for c in s["cols"]] + [f"{name}: ferrymq vs this"]
        w("| " + " | ".join(head) + " |")
        w("|---|---|" + "---:|" * (len(head) - 2))
        fv = None
        if FERRY in by[key] and not by[key][FERRY].get("na"):
            try:
                fv = f(by[key][FERRY])
            except (KeyError, TypeError, ZeroDivisionError):
                pass
        for p in peers:
            r = by[key].get(p)
            if not r:
                continue
            if r.get("na"):
                w(f"| **{p}** | {r['durability']} | n/a: {r['na']} |" + " |" * len(s["cols"]))
                continue
            cells = []
            for _, cf in s["cols"]:
                try:
                    cells.append(cf(r))
                except (KeyError, TypeError, ZeroDivisionError):
                    cells.append("–")
            try:
                v = f(r)
            except (KeyError, TypeError, ZeroDivisionError):
                v = None
            ratio = "(itself)" if p == FERRY else fmt_ratio(advantage(fv, v, hb))
            w(f"| **{p}** | {r['durability']} | " + " | ".join(cells) + f" | {ratio} |")
        w("")
        w("Commands (" + ", ".join(sorted({by[key][p]['date'] for p in by[key]})) + "; each against a freshly started broker, see the script for its config):")
        w("")
        for p in peers:
            r = by[key].get(p)
            if r and r.get("na"):
                w(f"- {p}: n/a — {r['na']}")
            elif r:
                errs = r["result"].get("errors") or []
                note = "" if not errs else "  — errors: " + "; ".join(f"{e.get('count')}× {e.get('err')}" for e in errs[:3])
                if r.get("cpu_profile"):
                    note += f"  — CPU profile (profiler on during this run): `{r['cpu_profile']}`, `go tool pprof -top` in `{r.get('cpu_top')}`"
                w(f"- {p}: `{r['command']}`{note}")
        w("")

    with open(a.report, "w") as fh:
        fh.write("\n".join(out) + "\n")
    with open(a.chart, "w") as fh:
        fh.write("scenario " + " ".join(peers) + "\n")
        for row in chart:
            fh.write(" ".join(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
