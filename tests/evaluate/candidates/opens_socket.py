"""Hides its import from the static screen and tries to reach a server on loopback."""

PORT = 0  # the test writes the port here


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        net = __import__("soc" + "ket")
        with net.create_connection(("127.0.0.1", PORT), timeout=2) as conn:
            conn.sendall(b"leak")

    return run
