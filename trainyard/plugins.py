"""Write your own layers and updaters: decorate them in a module the platform loads as a plugin
(docs/plugins.md).

    import torch
    from torch import nn
    from trainyard.plugins import layer

    @layer("rmsnorm")
    class RMSNorm(nn.Module):
        \"\"\"Root-mean-square normalisation over the last axis.\"\"\"

        def __init__(self, in_shape, *, eps: float = 1e-6):
            super().__init__()
            self.eps = eps
            self.scale = nn.Parameter(torch.ones(in_shape[-1]))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale

Importing this module imports torch (a plugin's process trains); `import trainyard` does not.
"""

from dsl.plugin_types import layer, updater
from dsl.plugins import PluginError

__all__ = ["PluginError", "layer", "updater"]
