"""The four models of issue 16 with random weights and random data, for
`record.py`: GPT-2 (transformers `GPT2Config`), BERT-Large (transformers
`BertConfig`), ResNet-50 (torchvision, or the local definition below when
torchvision is missing) and Swin-T (timm). Each comes with a batch, a loss and
an optimizer (AdamW for the transformers, SGD with momentum for ResNet-50, as
they are usually trained; `foreach=True`, PyTorch's default on CUDA, also on
the CPU so that CPU recordings have the same ops). Defaults fit an 80 GB H100 in fp32; `tiny` gives a
two-layer version of each that records in seconds on a CPU. Nothing is
downloaded.
"""

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn


@dataclass
class Built:
    model: nn.Module
    batch: Any
    loss_fn: Callable
    optimizer: torch.optim.Optimizer
    describe: str
    batch_size: int


def _tokens(vocab, batch, seq, device):
    return torch.randint(0, vocab, (batch, seq), device=device)


def gpt2(tiny, batch, seq, device, **_):
    from transformers import GPT2Config, GPT2LMHeadModel
    batch, seq = batch or (2 if tiny else 8), seq or (32 if tiny else 512)
    shape = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, bos_token_id=0, eos_token_id=0) \
        if tiny else \
        dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)
    config = GPT2Config(n_positions=max(seq, 1024), attn_implementation="eager", **shape)
    model = GPT2LMHeadModel(config).to(device).train()
    ids = _tokens(config.vocab_size, batch, seq, device)
    return Built(model, ids, lambda m, x: m(input_ids=x, labels=x).loss,
                 torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True),
                 f"GPT-2 layers={config.n_layer} hidden={config.n_embd} batch={batch} seq={seq} "
                 f"eager-attention fp32 AdamW", batch)


def bert(tiny, batch, seq, device, **_):
    from transformers import BertConfig, BertForMaskedLM
    batch, seq = batch or (2 if tiny else 8), seq or (32 if tiny else 512)
    shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, vocab_size=1000) if tiny else \
        dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
             intermediate_size=4096, vocab_size=30522)
    config = BertConfig(max_position_embeddings=max(seq, 512), attn_implementation="eager",
                        **shape)
    model = BertForMaskedLM(config).to(device).train()
    ids = _tokens(config.vocab_size, batch, seq, device)
    return Built(model, ids, lambda m, x: m(input_ids=x, labels=x).loss,
                 torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True),
                 f"BERT layers={config.num_hidden_layers} hidden={config.hidden_size} "
                 f"batch={batch} seq={seq} eager-attention fp32 AdamW", batch)


def _images(batch, side, classes, device):
    x = torch.randn(batch, 3, side, side, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    return x, y


def _classify(m, xy):
    return nn.functional.cross_entropy(m(xy[0]), xy[1])


def resnet50(tiny, batch, image, device, **_):
    batch, side = batch or (2 if tiny else 64), image or (64 if tiny else 224)
    try:
        from torchvision.models import resnet50 as tv_resnet50
        model, source = tv_resnet50(weights=None), "torchvision"
    except ImportError:
        model, source = LocalResNet50(), "local definition"
    if tiny:
        # Two bottleneck stages of one block each keep the layer kinds.
        model.layer2, model.layer3, model.layer4 = model.layer2[:1], nn.Identity(), nn.Identity()
        model.fc = nn.Linear(512, 10)
    model = model.to(device).train()
    classes = model.fc.out_features
    return Built(model, _images(batch, side, classes, device), _classify,
                 torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True),
                 f"ResNet-50 ({source}{', stages 1-2 only' if tiny else ''}) batch={batch} "
                 f"image={side} fp32 SGD-momentum", batch)


def swin_t(tiny, batch, image, device, **_):
    import timm
    batch, side = batch or (2 if tiny else 64), image or (64 if tiny else 224)
    extra = dict(embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 2, 4), window_size=2,
                 num_classes=10) if tiny else {}
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=side,
                              **extra).to(device).train()
    classes = model.num_classes
    return Built(model, _images(batch, side, classes, device), _classify,
                 torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True),
                 f"Swin-T (timm{', tiny' if tiny else ''}) batch={batch} image={side} fp32 AdamW",
                 batch)


MODELS = {"gpt2": gpt2, "bert": bert, "resnet50": resnet50, "swin_t": swin_t}


def build(name, tiny=False, batch=None, seq=None, image=None, device="cpu"):
    return MODELS[name](tiny=tiny, batch=batch, seq=seq, image=image, device=device)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3), as torchvision's."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


class LocalResNet50(nn.Module):
    """ResNet-50 with torchvision's layout and attribute names, for machines
    without torchvision."""

    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes, layers = 64, []
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            stage = []
            for b in range(blocks):
                stage.append(Bottleneck(inplanes, planes, stride if b == 0 else 1))
                inplanes = planes * Bottleneck.expansion
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
