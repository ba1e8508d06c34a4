"""A dispatch mode that records the rlkernels ops (native or Triton custom ops) a call dispatches."""

from torch.utils._python_dispatch import TorchDispatchMode


class KernelCalls(TorchDispatchMode):
    """Records the rlkernels ops a call dispatches, by name, in `ops` ("policy_loss", "kl_penalty", ...)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if getattr(func, "namespace", "") == "rlkernels":
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
