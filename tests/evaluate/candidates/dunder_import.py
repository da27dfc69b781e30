"""Hides ``subprocess`` behind ``__import__`` and a joined string, then spawns a
detached process (marker ``evk-redteam``) and fails its build. Refused by the AST
screen (``__import__``); with the screen off, it must not survive its evaluation."""


def build(params, kernels):
    spawn = __import__("sub" + "process")
    spawn.Popen(["/bin/sh", "-c", "exec -a evk-redteam-dunder sleep 600"], start_new_session=True)
    raise RuntimeError("started evk-redteam-dunder")
