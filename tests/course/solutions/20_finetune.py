"""Module 20 (finetune): a student's solutions, written from the lesson alone."""


class LoRALinear:
    def delta_weight(self):
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x):
        h = linear(self.dropout(x), self.lora_A)
        update = linear(h, self.lora_B)
        return self.base(x) + update * self.scaling


def inject(model, targets=("c_attn", "c_proj"), r=8, alpha=16, dropout=0.0):
    # check the settings before anything changes
    check_int("r", r, minimum=1)
    check_number("alpha", alpha, above=0)
    Dropout(dropout)

    def matches(name):
        return any(name == target or name.endswith("." + target) for target in targets)

    chosen = [module for name, module in model.named_modules()
              if name and isinstance(module, ADAPTED_KINDS) and matches(name)]
    if not chosen:
        raise ValueError(f"inject: no Linear (or quantized) layer of {type(model).__name__} has a name ending in "
                         f"one of {targets}")
    for parameter in model.parameters():
        parameter.requires_grad = False
    for layer in chosen:
        replace_module(model, layer, LoRALinear(layer, r, alpha, dropout))


def merge(model):
    with no_grad():
        for name, layer in layers:
            weight = layer.base.weight
            weight.data[...] = weight.data + layer.delta_weight().data.astype(weight.dtype)
            replace_module(model, layer, layer.base)


def adapter_state_dict(model):
    wanted = set()
    for name, layer in adapted_layers(model):
        prefix = name + "." if name else ""
        wanted.add(prefix + "lora_A")
        wanted.add(prefix + "lora_B")
    return {key: value for key, value in model.state_dict().items() if key in wanted}


def distillation_loss(student_logits, teacher_logits, targets, temperature=2.0, alpha=0.5):
    log_p_student = (student / temperature).log_softmax(-1)
    log_p_teacher = (teacher / temperature).log_softmax(-1)
    p_teacher = log_p_teacher.exp()
    samples = student.shape[0]
    kl = (p_teacher * (log_p_teacher - log_p_student)).sum() / samples
    ce = cross_entropy(student, targets)
    return kl * (alpha * temperature ** 2) + ce * (1 - alpha)


def l1_unstructured_mask(importance, amount, mask=None):
    kept = kept.copy()
    candidates = xp.flatnonzero(kept)  # the entries the mask still keeps
    count = pruned_count(amount, int(candidates.size), "entries")
    magnitudes = xp.abs(importance.data.reshape(-1))[candidates]
    order = xp.argsort(magnitudes, kind="stable")  # ties: first in row-major order
    kept[candidates[order[:count]]] = 0
    return Tensor._make(kept.reshape(importance.shape), importance._backend)


def ln_structured_mask(importance, amount, n, dim, mask=None):
    dim = dim % importance.ndim
    others = tuple(axis for axis in range(importance.ndim) if axis != dim)
    magnitudes = xp.abs(importance.data)
    if n == math.inf:
        norms = magnitudes.max(axis=others) if others else magnitudes
    else:
        norms = (magnitudes ** n).sum(axis=others) ** (1 / n)
    alive = (kept != 0).any(axis=others) if others else kept != 0  # slices not zeroed entirely
    candidates = xp.flatnonzero(alive)
    count = pruned_count(amount, int(candidates.size), "slices")
    order = xp.argsort(norms[candidates], kind="stable")  # ties: the first index
    index = [slice(None)] * importance.ndim
    index[dim] = candidates[order[:count]]
    kept = kept.copy()
    kept[tuple(index)] = 0
    return Tensor._make(kept, importance._backend)


def custom_from_mask(module, name, mask):
    if is_pruned(module, name):
        stored = getattr(module, name + "_mask")
        stored.data[...] = stored.data * mask.data
    else:
        parameter = module._parameters[name]
        delattr(module, name)
        setattr(module, name + "_orig", parameter)
        module.register_buffer(name + "_mask", mask)
    forward = pruned_forward(module)
    if name not in forward.names:
        forward.names.append(name)
    apply_mask(module, name)


def remove(module, name):
    parameter = getattr(module, name + "_orig")
    mask = getattr(module, name + "_mask")
    with no_grad():
        parameter.data[...] = parameter.data * mask.data
    if name in module.__dict__:
        delattr(module, name)  # the plain attribute the forward set
    delattr(module, name + "_orig")
    delattr(module, name + "_mask")
    setattr(module, name, parameter)
    forward = pruned_forward(module)
    forward.names.remove(name)
    if not forward.names:
        object.__delattr__(module, "forward")  # the module's own forward again
