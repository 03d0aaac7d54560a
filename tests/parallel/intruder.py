"""A foreign local process that attacks a job's transports while it trains (it holds no key).

    python intruder.py state tcp://HOST:PORT SIZE           ESync's state server
    python intruder.py activations tcp://HOST:PORT ...      every rank's WAGMA activation socket

Sends garbage, oversized and deeply nested lines, unsealed messages posing as a rank (a huge
capability, ``leave``, a rank out of range, ``Infinity``), messages with a made-up MAC, holds 100
idle connections for a second, and for activations 500 forged future activations, a line over the
limit and 10,000 raw NUL bytes without a newline. Each activation message goes on a connection of
its own (the receiver ends a connection at its first refused line), so every rank must refuse and
count each of them. Prints how many messages it sent; exits 0.
"""
import json
import socket
import sys
import time


def state(address, size):
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    target = (host, int(port))
    query = {"op": "query", "rank": 1, "k": 1, "c": 1e9, "round": 0, "seq": 1}
    lines = [b"junk\n", b"[" * 200_000 + b"\n", b"x" * 100_000, json.dumps(query).encode() + b"\n",
             json.dumps({"op": "leave", "rank": size - 1}).encode() + b"\n",
             json.dumps(dict(query, rank=size + 5)).encode() + b"\n",
             json.dumps(dict(query, rank=0)).replace("1000000000.0", "Infinity").encode() + b"\n",
             b"1 " + b"0" * 64 + b' {"op": "leave", "rank": 1}\n']
    sent = 0
    for line in lines * 5:
        with socket.create_connection(target, timeout=2) as sock:
            try:
                sock.sendall(line)
                sent += 1
            except OSError:                         # hung up on before it read it all
                pass
    held = [socket.create_connection(target, timeout=2) for _ in range(100)]
    time.sleep(1.0)
    for sock in held:
        sock.close()
    return sent


def _send_alone(target, data):
    """Send ``data`` on a connection of its own; 1 if it was sent whole, else 0."""
    with socket.create_connection(target, timeout=2) as sock:
        try:
            sock.sendall(data)
            return 1
        except OSError:                             # hung up on before it read it all
            return 0


def activations(addresses):
    targets = []
    for address in addresses:
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        targets.append((host, int(port)))
    messages = [b"junk", b"5 0,1", b"0 7 " + b"0" * 64 + b" 7 0,1", b"\xff" * 64]
    messages += [b"0 %d %s %d 0,1" % (n, b"0" * 64, n) for n in range(10, 510)]
    messages += [b"0 " * 5000]                      # a line over 8 kB
    sent = 0
    for target in targets:
        for message in messages:
            sent += _send_alone(target, message + b"\n")
        sent += _send_alone(target, b"\x00" * 10_000)  # raw bytes, no newline
    held = [socket.create_connection(target, timeout=2) for target in targets for _ in range(100)]
    time.sleep(1.0)
    for sock in held:
        sock.close()
    return sent


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    print(state(args[0], int(args[1])) if kind == "state" else activations(args))
