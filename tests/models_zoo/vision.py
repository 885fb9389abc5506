"""Vision models of the zoo: ResNet-style blocks with BatchNorm, a ViT, a U-Net, a
ShuffleNet/SE block, timm-style habits, pyramid pooling, a 1-D conv audio stack. Models only:
inputs and expectations are in cases.py and test_models.py."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------
# Vision: ResNet-style basic blocks with BatchNorm
# ---------------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)  # as in torchvision
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class TinyResNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2), BasicBlock(16, 16))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class AudioConvNet(nn.Module):
    """1-D conv stack over a waveform: strided convs, BatchNorm1d, pooling, global average."""

    def __init__(self, classes=6):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 8, 9, stride=2, padding=4), nn.BatchNorm1d(8), nn.ReLU(),
            nn.Conv1d(8, 16, 5, stride=2, padding=2), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 16, 3, padding=1, groups=4), nn.GroupNorm(4, 16), nn.ReLU(),
        )
        self.fc = nn.Linear(16, classes)

    def forward(self, wav):  # (B, samples)
        x = self.features(wav.unsqueeze(1))
        return self.fc(x.mean(dim=-1))




class TinyViT(nn.Module):
    """Patch embedding by a strided conv, a class token, learned position embeddings, pre-norm
    encoder layers, classification from the class token."""

    def __init__(self, img=16, patch=4, d=32, classes=5):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, activation="gelu",
                                                                 batch_first=True, norm_first=True)
                                      for _ in range(1)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class TinyUNet(nn.Module):
    """Down (conv, maxpool), up (transposed conv and bilinear interpolate), skip concatenation."""

    def __init__(self):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
        self.enc2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 1))

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        u = self.up(e2) + F.interpolate(e2[:, :8], scale_factor=2, mode="bilinear", align_corners=False)
        return self.dec(torch.cat([u, e1], dim=1))


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(s))))


class ShuffleSEBlock(nn.Module):
    """Grouped/depthwise convs, channel shuffle by view/transpose, squeeze-excitation, Hardswish."""

    def __init__(self, c=16, groups=4):
        super().__init__()
        self.groups = groups
        self.pw = nn.Conv2d(c, c, 1, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.se = SqueezeExcite(c)
        self.act = nn.Hardswish()

    @staticmethod
    def shuffle(x, groups):
        b, c, h, w = x.size()
        return x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous().view(b, c, h, w)

    def forward(self, x):
        y = self.act(self.bn(self.pw(x)))
        y = self.shuffle(y, self.groups)
        y = self.se(self.dw(y))
        return self.act(y + x)



class TimmStyleNet(nn.Module):
    """Habits of timm/torchvision code: torch.jit.is_scripting() checks, an assert with an
    f-string, stages reached by getattr(self, f"stage{i}"), a property, a class constant."""

    NUM_STAGES = 2

    def __init__(self):
        super().__init__()
        self.grad_checkpointing = False
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        for i in range(self.NUM_STAGES):
            setattr(self, f"stage{i}", nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU()))
        self.head = nn.Linear(8, 4)

    @property
    def num_features(self):
        return self.head.in_features

    def forward_features(self, x):
        assert x.dim() == 4, f"expected NCHW input, got {x.dim()} dims"
        x = self.stem(x)
        for i in range(self.NUM_STAGES):
            stage = getattr(self, f"stage{i}")
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = torch.utils.checkpoint.checkpoint(stage, x, use_reentrant=False)
            else:
                x = stage(x)
        return x

    def forward(self, x):
        x = self.forward_features(x)
        x = x.mean((2, 3)).reshape(-1, self.num_features)
        return self.head(x)



class PyramidPool(nn.Module):
    """Multi-scale pooling with list comprehensions and torch.cat."""

    sizes = (1, 2, 4)

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * sum(s * s for s in self.sizes), 3)

    def forward(self, x):
        x = F.relu(self.conv(x))
        feats = [F.adaptive_avg_pool2d(x, s) for s in self.sizes]
        return self.fc(torch.cat([f.flatten(1) for f in feats], dim=1))


def drop_path(x, drop_prob: float = 0.0, training: bool = False):
    """Stochastic depth per sample, as written in timm."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class DropPathBlock(nn.Module):
    """A residual conv block with timm's DropPath (random in training, identity in eval)."""

    def __init__(self, c=8, drop_prob=0.3):
        super().__init__()
        self.drop_prob = drop_prob
        self.conv = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.GELU())

    def forward(self, x):
        return x + drop_path(self.conv(x), self.drop_prob, self.training)


class TinyFPN(nn.Module):
    """Feature-pyramid top-down path: lateral 1x1 convs, F.interpolate(size=...shape[-2:])."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.c3 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.lateral = nn.ModuleList([nn.Conv2d(c, 8, 1) for c in (8, 16, 32)])

    def forward(self, x):
        f1 = F.relu(self.c1(x))
        f2 = F.relu(self.c2(f1))
        f3 = F.relu(self.c3(f2))
        feats = [lat(f) for lat, f in zip(self.lateral, (f1, f2, f3))]
        out = [feats[-1]]
        for f in reversed(feats[:-1]):
            up = F.interpolate(out[0], size=f.shape[-2:], mode="nearest")
            out.insert(0, f + up)
        return out

