// Anchor translation unit for the shared <torch/torch.h> precompiled header.
