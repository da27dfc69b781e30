"""Does not parse."""


def build(params, kernels)
    return None
