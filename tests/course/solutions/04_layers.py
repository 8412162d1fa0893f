"""Module 04 (layers): a student's solutions, written from the lesson alone."""


class Module:
    def __setattr__(self, name, value):
        registries = self.__dict__.get("_parameters"), self.__dict__.get("_buffers"), self.__dict__.get("_modules")
        if None in registries:
            if isinstance(value, (Parameter, Module, Tensor)):
                raise AttributeError(
                    f"cannot assign {name!r} before Module.__init__() ran: call super().__init__() first "
                    f"in {type(self).__name__}.__init__"
                )
            object.__setattr__(self, name, value)
            return
        parameters, buffers, modules = registries
        if isinstance(value, Parameter):
            buffers.pop(name, None)
            modules.pop(name, None)
            parameters[name] = value
        elif isinstance(value, Module):
            parameters.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"buffer {name!r} must be a Tensor or None, got {type(value).__name__}")
            buffers[name] = value
        else:
            parameters.pop(name, None)
            modules.pop(name, None)
        object.__setattr__(self, name, value)

    def named_modules(self, prefix=""):
        found = []
        seen = set()
        stack = [(prefix, self)]  # depth first, parents before children, children in registration order
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            found.append((name, module))
            children = [(f"{name}.{child_name}" if name else child_name, child)
                        for child_name, child in module._modules.items() if child is not None]
            stack.extend(reversed(children))
        return found


    def to(self, device=None, dtype=None):
        target = None if device is None else get_backend(device)
        new_dtype = None if dtype is None else np.dtype(dtype)
        tensors = []
        for t in self.parameters() + self.buffers():
            tensors.append(t)
            if t.grad is not None:
                tensors.append(t.grad)
        for t in tensors:
            array, backend = t.data, t._backend
            if target is not None and target is not backend:
                array = target.from_host(backend.to_host(array))
                backend = target
            if new_dtype is not None and is_floating(array.dtype) and array.dtype != new_dtype:
                array = array.astype(new_dtype)
            t.data, t._backend = array, backend
        return self

    def state_dict(self):
        state = {}
        for name, t in self.named_parameters() + self.named_buffers():
            state[name] = Tensor._make(t._backend.xp.array(t.data, copy=True), t._backend)
        return state

    def load_state_dict(self, state, strict=True):
        own = dict(self.named_parameters() + self.named_buffers())
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        values = {}
        mismatched = []
        for name, target in own.items():
            if name not in state:
                continue
            value = Tensor(state[name], dtype=target.dtype, device=target._backend)
            if value.shape != target.shape:
                mismatched.append(f"size mismatch for {name!r}: the state has shape {value.shape}, "
                                  f"the module's tensor has shape {target.shape}")
            values[name] = value
        errors = []
        if strict and missing:
            errors.append("missing keys: " + ", ".join(repr(name) for name in missing))
        if strict and unexpected:
            errors.append("unexpected keys: " + ", ".join(repr(name) for name in unexpected))
        errors += mismatched
        if errors:
            raise RuntimeError(f"error(s) in loading the state dict of {type(self).__name__}:\n  "
                               + "\n  ".join(errors))
        for name, value in values.items():
            own[name].data[...] = value.data
        return IncompatibleKeys(missing, unexpected)


class LinearFunction:
    def backward(self, grad):
        xp, x, weight = self.xp, self.x, self.weight
        out_features, in_features = weight.shape
        grad_x = grad_w = grad_b = None
        rows = grad.reshape(-1, out_features)
        if self.inputs[0].requires_grad:
            grad_x = grad @ weight
        if self.inputs[1].requires_grad:
            grad_w = xp.matmul(rows.T, x.reshape(-1, in_features), out=xp.empty_like(weight))
        if len(self.inputs) == 2:
            return grad_x, grad_w
        if self.inputs[2].requires_grad:
            grad_b = rows.sum(axis=0)
        return grad_x, grad_w, grad_b


class ModuleList:
    def append(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} holds Modules, got {type(module).__name__}")
        setattr(self, str(len(self._modules)), module)
        return self
