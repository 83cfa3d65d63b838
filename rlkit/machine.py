"""What this machine offers that rlkit's defaults depend on (a module of its own: the CLI, the
launcher and the inference server's flags ask it without importing torch up front)."""


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
