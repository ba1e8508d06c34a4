"""torch.library custom ops, their fake (meta) and autograd registrations, backend selection, input
validation, and the public functions re-exported by `rlkernels`."""
