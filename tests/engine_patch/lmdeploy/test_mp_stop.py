"""A stopped api_server exits although its engine process is gone (boot/mp_stop.py).

Reproduced with LMDeploy's own ``AsyncRPCClient`` against a real ZMQ ROUTER in another process:
the client talks to it, the server process is killed, a message is left queued for it, and the
client closes. Stock ``close_sockets`` then waits in ``Context.term()`` forever (the child is
killed after the bound); the upgrade's returns at once. Each case runs in its own interpreter so a
hang cannot stall the suite.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("zmq")

CHILD = textwrap.dedent("""
    import multiprocessing as mp, os, signal, sys, time
    import zmq

    def server(port_box, ready):
        ctx = zmq.Context()
        s = ctx.socket(zmq.ROUTER)
        port_box.value = s.bind_to_random_port("tcp://127.0.0.1")
        ready.set()
        ident, _ = s.recv_multipart()
        s.send_multipart([ident, b"pong"])
        time.sleep(120)

    if __name__ == "__main__":
        from lmdeploy.pytorch.engine.mp_engine.zmq_rpc import AsyncRPCClient
        if sys.argv[1] == "upgraded":
            from tokenrails.engine_patch.lmdeploy.boot.mp_stop import patched_close_sockets
            AsyncRPCClient.close_sockets = patched_close_sockets(AsyncRPCClient.close_sockets)
        port, ready = mp.Value("i", 0), mp.Event()
        proc = mp.Process(target=server, args=(port, ready), daemon=True)
        proc.start()
        ready.wait(30)
        client = AsyncRPCClient(port=port.value)
        client.sync_socket.send(b"ping")
        assert client.sync_socket.recv() == b"pong"
        os.kill(proc.pid, signal.SIGKILL)  # the engine process is gone
        proc.join()
        client.sync_socket.send(b"never read" * 100)  # queued for it
        print("closing", flush=True)
        t0 = time.monotonic()
        client.close_sockets()
        print(f"closed {time.monotonic() - t0:.3f}", flush=True)
""")


def _close_after_the_server_died(tmp_path, which: str, wait: float = 5.0) -> float | None:
    """Seconds the client's close took, or None when it was still closing after ``wait`` s."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TOKENRAILS_LMDEPLOY", None)
    proc = subprocess.Popen([sys.executable, str(script), which], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        for line in proc.stdout:  # the child's set-up (imports, server, a round trip) takes its time
            if line.strip() == "closing":
                break
        else:
            raise AssertionError(f"the child ended before closing: {proc.stderr.read()[-2000:]}")
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None
        assert proc.returncode == 0, proc.stderr.read()[-2000:]
        return float(proc.stdout.read().split("closed")[-1])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_stock_close_waits_forever_for_a_dead_engine(tmp_path):
    assert _close_after_the_server_died(tmp_path, "stock") is None


def test_the_upgraded_close_returns_at_once(tmp_path):
    took = _close_after_the_server_died(tmp_path, "upgraded")
    assert took is not None and took < 1.0


def test_the_upgrade_installs_it(upgraded):
    from lmdeploy.pytorch.engine.mp_engine.zmq_rpc import AsyncRPCClient

    assert hasattr(AsyncRPCClient.close_sockets, "__wrapped__")
