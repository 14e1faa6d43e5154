"""The loopback check the server tests use (tests/listening.py), against sockets bound here."""

import socket

import pytest
from listening import listen_addresses

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("family", "host", "expect"), [(socket.AF_INET, "127.0.0.1", {"127.0.0.1"}),
                                                        (socket.AF_INET, "0.0.0.0", {"0.0.0.0"}),
                                                        (socket.AF_INET6, "::1", {"::1"}),
                                                        (socket.AF_INET6, "::", {"::"})])
def test_listen_addresses_reads_what_a_socket_is_bound_to(family, host, expect):
    with socket.socket(family) as s:
        try:
            s.bind((host, 0))
        except OSError as e:  # a machine without IPv6
            pytest.skip(f"cannot bind {host}: {e}")
        assert listen_addresses(s.getsockname()[1]) == set()  # bound, not yet listening
        s.listen()
        assert listen_addresses(s.getsockname()[1]) == expect
