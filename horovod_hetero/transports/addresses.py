"""The address a rank's servers bind and advertise to the other ranks (ESync's state server, WAGMA's
activations): loopback on one host; across hosts, the user's setting or the interface horovodrun
chose for Gloo or MPI (``server_host``). Standard library and psutil only: nothing of Horovod."""
from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any

from horovod_hetero.validation import check_host
from horovod_hetero.errors import troubleshooting

#: The address servers bind and advertise when ranks span machines (default: see ``server_host``).
ENV_SERVER_HOST = "HOROVOD_HETERO_STATE_SERVER_HOST"
#: What horovodrun exports for Gloo: the network interface every host has and routes (its first
#: common one), and the launcher's rendezvous address.
ENV_GLOO_IFACE, ENV_RENDEZVOUS = "HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_RENDEZVOUS_ADDR"
#: Under MPI: the interfaces horovodrun --mpi found on every host (it exports them for NCCL, and hands
#: them to Open MPI's TCP transport as ``btl_tcp_if_include``), or what the user set for either.
ENV_MPI_IFACES = ("NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include")

def server_host(all_local: bool) -> str:
    """The address servers bind (that interface only) and advertise to the other ranks.

    Loopback when every rank runs on this machine. Otherwise, the first of:
    ``$HOROVOD_HETERO_STATE_SERVER_HOST``; the IPv4 address of ``$HOROVOD_GLOO_IFACE``, the
    interface horovodrun found on every host and hands Gloo (so the job's own traffic takes it
    too); under MPI, the interface of ``$NCCL_SOCKET_IFNAME`` (horovodrun --mpi exports the common
    interfaces there) or ``$OMPI_MCA_btl_tcp_if_include``; the address this host reaches the launcher's rendezvous server from
    (``$HOROVOD_GLOO_RENDEZVOUS_ADDR``); this host's name if it resolves to an address that is
    not loopback; the only interface with an IPv4 address that is not loopback. None of them: a
    ``ValueError`` that names the variable to set (many hosts resolve their own name to
    127.0.1.1, which no other host reaches)."""
    if all_local:
        return "127.0.0.1"
    setting = server_host_setting()
    if setting:
        return setting
    candidates: tuple[Callable[[], str | None], ...] = (
        lambda: interface_address(os.environ.get(ENV_GLOO_IFACE)), _mpi_interface_address,
        lambda: route_address(os.environ.get(ENV_RENDEZVOUS)), _host_name_address, _only_interface_address)
    for candidate in candidates:
        address = candidate()                       # an IPv4 address or None
        if address and not ipaddress.ip_address(address).is_loopback:
            return address
    raise ValueError(f"ranks run on several hosts, but no address other hosts reach this one at was found "
                     f"({ENV_GLOO_IFACE} unset or without an IPv4 address, this host's name resolves to "
                     f"loopback, several interfaces): set {ENV_SERVER_HOST} to this host's address on the "
                     f"network the ranks share, e.g. {ENV_SERVER_HOST}=10.0.0.5\n{troubleshooting('troubleshooting-server-host')}")

def _interfaces() -> dict[str, list[Any]]:
    """``psutil.net_if_addrs()`` (psutil comes with Horovod, which requires it and finds its interfaces with it)."""
    import psutil
    return psutil.net_if_addrs()

def interface_address(name: str | None) -> str | None:
    """The IPv4 address of network interface ``name``, or None (no such interface, no IPv4 address)."""
    for address in _interfaces().get(name or "", ()):
        if address.family == socket.AF_INET:
            return address.address
    return None

def _mpi_interface_address() -> str | None:
    """The IPv4 address of the first interface ``ENV_MPI_IFACES`` name (a list, comma-separated; NCCL's
    ``=name`` is that name exactly, ``name`` any interface whose name starts with it, ``^...`` excludes:
    not a choice)."""
    for variable in ENV_MPI_IFACES:
        for item in (os.environ.get(variable) or "").split(","):
            item = item.strip()
            if not item or item.startswith("^"):
                continue
            exact = item.startswith("=")
            names = [item[1:]] if exact else sorted(n for n in _interfaces() if n.startswith(item))
            for name in names:
                address = interface_address(name)
                if address:
                    return address
    return None

def route_address(host: str | None) -> str | None:
    """The local address packets to ``host`` leave from (a UDP connect: nothing is sent), or None."""
    if not host:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            return probe.getsockname()[0]
        except OSError:
            return None

def _host_name_address() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None

def _only_interface_address() -> str | None:
    addresses = [a.address for addrs in _interfaces().values() for a in addrs
                 if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback]
    return addresses[0] if len(addresses) == 1 else None

def server_host_setting() -> str | None:
    """``$HOROVOD_HETERO_STATE_SERVER_HOST`` (a host name or IP address), or ``None`` if unset; a
    ``ValueError`` names the variable when it is neither."""
    text = os.environ.get(ENV_SERVER_HOST)
    return check_host(ENV_SERVER_HOST, text) if text else None
