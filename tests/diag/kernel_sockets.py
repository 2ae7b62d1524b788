"""The kernel's view of a server's TCP port (Linux /proc/net/tcp), for a
failed test's report beside the server's stacks: a request the server never
saw shows here as a connection not yet accepted (the listening socket's
queue) or as bytes it has not read; its stacks cannot show either."""

from __future__ import annotations

STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
          "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
          "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def port_sockets(port: int) -> list[dict]:
    """The sockets whose local port is `port`: state, the peer's port, and
    the bytes received but not read (for a listening socket: the connections
    not yet accepted) and sent but not acknowledged."""
    rows = []
    for table in TABLES:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
            if int(local.rsplit(":", 1)[1], 16) != port:
                continue
            unsent, unread = (int(x, 16) for x in queues.split(":"))
            rows.append({"state": STATES.get(state, state),
                         "peer_port": int(remote.rsplit(":", 1)[1], 16),
                         "unread": unread, "unsent": unsent})
    return rows


def describe(port: int) -> str:
    """One line per listening socket, then every connection not idle in the
    kernel (bytes waiting either way, or closing; a closed one's TIME_WAIT
    only counted), then a count by state."""
    rows = port_sockets(port)
    lines = [f"kernel sockets on port {port}:"]
    for r in rows:
        if r["state"] == "LISTEN":
            lines.append(f"  listening: {r['unread']} connections not yet accepted")
    counts: dict[str, int] = {}
    for r in rows:
        if r["state"] == "LISTEN":
            continue
        counts[r["state"]] = counts.get(r["state"], 0) + 1
        if r["unread"] or r["unsent"] or r["state"] not in ("ESTABLISHED", "TIME_WAIT"):
            lines.append(f"  {r['state']} peer :{r['peer_port']}: {r['unread']} bytes "
                         f"unread by the server, {r['unsent']} unacknowledged")
    lines.append("  connections: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                                      or "none"))
    return "\n".join(lines) + "\n"
