"""cudal2.patch on real models: copies (deepcopy, pickle, torch.save/torch.load) of a patched model
compute the same and stay patched; a layer with its own forward (a subclass, accelerate's hooks)
is left alone; where dispatch answers torch the layer's own F.linear (bias fused) runs;
CUDAL2_DISABLE=1 makes patch() a no-op; every CUDAL2_* variable is checked, value and name.

Without a GPU: CPU tensors stand in for CUDA ones (is_cuda reads True, device -1), and either a
fake kernel serves every shape (`kernels`) or the real dispatch decides over an empty table
(`torch_dispatch`: every shape goes to torch)."""
import copy
import functools
import io
import os
import pickle

import pytest
import torch

import cudal2
from cudal2.core import knobs
from cudal2.core.store import KernelIndex
from cudal2.runtime import hot, resolve
from cudal2.runtime import patch as patch_mod

F16, F32 = torch.float16, torch.float32
linear = torch.nn.functional.linear


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(32, 8, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Doubled(torch.nn.Linear):
    def forward(self, x):           # a subclass's own forward: patch() must leave it running
        return super().forward(x) * 2


class Renamed(torch.nn.Linear):     # a subclass that keeps nn.Linear's forward: patched
    pass


def _net(dtype=F32):
    torch.manual_seed(0)
    return Net().to(dtype)


def _x(shape, dtype=F32, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _is_patched(layer):
    return "forward" in layer.__dict__ and isinstance(layer.forward, patch_mod._PatchedForward)


HOW = ["deepcopy", "pickle-0", "pickle-5", "torch.save"]


def _roundtrip(how, model):
    if how == "deepcopy":
        return copy.deepcopy(model)
    if how.startswith("pickle"):
        return pickle.loads(pickle.dumps(model, protocol=int(how[-1])))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No CUDAL2_* variable of the caller's shell leaks into these tests."""
    for name in [n for n in os.environ if n.startswith("CUDAL2_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))


@pytest.fixture
def kernels(fake_cuda, monkeypatch):
    """Every call that reaches dispatch is served by a fake kernel (C = A @ B in fp32, stored fp16);
    each launch is recorded as (A's shape, B's storage: the layer's weight)."""
    calls = []

    def fake_launch(a, b, out):
        calls.append((tuple(a.shape), b.data_ptr()))
        return (a.float() @ b.float()).half()
    monkeypatch.setattr(patch_mod, "_launch", fake_launch)
    return calls


@pytest.fixture
def torch_dispatch(fake_cuda, tmp_path, monkeypatch):
    """The real hot path and dispatch over an empty kernel table: every shape is decided torch."""
    root = tmp_path / "kernels"
    KernelIndex(root).write()
    monkeypatch.setenv("CUDAL2_KERNELS", str(root))
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    resolve.reset()
    resolve.state.arch[-1] = "sm_90a"
    monkeypatch.setattr(hot, "_cur_device", lambda: -1)
    monkeypatch.setattr(hot, "_raw_stream", lambda dev: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    yield
    resolve.reset()


@pytest.fixture
def linear_spy(monkeypatch):
    """Records each F.linear call as (input shape, weight, bias) and runs the real one."""
    seen = []

    def spy(x, w, b=None):
        seen.append((tuple(x.shape), w, b))
        return linear(x, w, b)
    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    return seen


# -- results on CPU, copies ----------------------------------------------------------------------
def test_cpu_fp32_is_identical_to_unpatched():
    m = _net()
    x, x3 = _x((5, 16)), _x((2, 5, 16))
    want, want3 = m(x), m(x3)
    cudal2.patch(m)
    assert all(_is_patched(l) for l in _linears(m))
    assert torch.equal(m(x), want) and torch.equal(m(x3), want3)


@pytest.mark.parametrize("how", HOW)
def test_copies_of_a_patched_model_compute_the_same_and_unpatch(how):
    m = cudal2.patch(_net())
    x = _x((4, 16))
    want = m(x)
    c = _roundtrip(how, m)
    assert all(_is_patched(l) for l in _linears(c))
    assert torch.equal(c(x), want)
    with torch.no_grad():
        c.fc2.weight.zero_()        # the copy's forward reads the copy's weights, not m's
    assert torch.equal(c(x), torch.zeros(4, 8)) and torch.equal(m(x), want)
    cudal2.unpatch(c)
    assert all("forward" not in l.__dict__ for l in _linears(c))
    assert all(_is_patched(l) for l in _linears(m))
    assert torch.equal(c(x), torch.zeros(4, 8))


@pytest.mark.parametrize("how", HOW)
def test_copies_serve_kernels_with_their_own_weights(how, kernels):
    m = cudal2.patch(_net(F16))
    c = _roundtrip(how, m)
    x = _x((2, 3, 16), F16)
    with torch.no_grad():
        got = c(x)
        want = linear(torch.relu(linear(x.float(), c.fc1.weight.float(), c.fc1.bias.float())),
                      c.fc2.weight.float())
    assert kernels == [((6, 16), c.fc1.weight.data_ptr()), ((6, 32), c.fc2.weight.data_ptr())]
    assert got.shape == (2, 3, 8) and torch.allclose(got.float(), want, atol=2e-2, rtol=2e-2)


def test_patched_model_compiles_fullgraph_on_cpu():
    torch._dynamo.reset()
    m = cudal2.patch(_net())
    x = _x((4, 16))
    assert torch.equal(torch.compile(m, fullgraph=True, backend="eager")(x), m(x))


# -- layers with their own forward ---------------------------------------------------------------
def test_subclass_with_its_own_forward_is_left_alone(kernels):
    torch.manual_seed(0)
    m = torch.nn.Sequential(Doubled(16, 16).half(), Renamed(16, 8).half())
    cudal2.patch(m)
    assert "forward" not in m[0].__dict__ and _is_patched(m[1])
    x = _x((4, 16), F16)
    with torch.no_grad():
        h = m[0](x)
        m[1](h)
    assert torch.equal(h, linear(x, m[0].weight, m[0].bias) * 2)
    assert kernels == [((4, 16), m[1].weight.data_ptr())]   # only the plain-forward subclass


def _hook_like_accelerate(module, seen):
    """accelerate's add_hook_to_module, reduced: the old forward kept in _old_forward, the
    instance's forward a partial of a wrapper that runs the hook first."""
    old = module.forward
    module._old_forward = old

    def new_forward(module, *args, **kwargs):
        seen.append(module)
        return module._old_forward(*args, **kwargs)
    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old)


def test_layer_whose_forward_is_wrapped_on_the_instance_is_left_alone(kernels):
    m = _net(F16)
    seen = []
    _hook_like_accelerate(m.fc1, seen)
    wrapper = m.fc1.forward
    cudal2.patch(m)
    assert m.fc1.forward is wrapper and _is_patched(m.fc2)
    with torch.no_grad():
        m(_x((4, 16), F16))
    assert seen == [m.fc1]
    assert kernels == [((4, 32), m.fc2.weight.data_ptr())]
    cudal2.unpatch(m)
    assert m.fc1.forward is wrapper and "forward" not in m.fc2.__dict__


def test_accelerate_hooks_run_before_and_after_patch(kernels):
    hooks = pytest.importorskip("accelerate.hooks")

    class Record(hooks.ModelHook):
        def __init__(self, seen):
            self.seen = seen

        def pre_forward(self, module, *args, **kwargs):
            self.seen.append(module)
            return args, kwargs

    m, seen = _net(F16), []
    x = _x((4, 16), F16)
    hooks.add_hook_to_module(m.fc1, Record(seen))     # hooked before patch(): left alone
    cudal2.patch(m)
    with torch.no_grad():
        m(x)
    assert seen == [m.fc1] and kernels == [((4, 32), m.fc2.weight.data_ptr())]
    hooks.add_hook_to_module(m.fc2, Record(seen))     # hooked after: the hook wraps the kernel path
    kernels.clear()
    with torch.no_grad():
        m(x)
    assert seen[1:] == [m.fc1, m.fc2] and kernels == [((4, 32), m.fc2.weight.data_ptr())]
    cudal2.unpatch(m)                                 # beneath fc2's hook: nn.Linear's forward
    kernels.clear()
    with torch.no_grad():
        m(x)
    assert kernels == [] and seen[3:] == [m.fc1, m.fc2]
    hooks.remove_hook_from_module(m.fc1)              # leaves a bound nn.Linear.forward behind
    cudal2.patch(m)
    assert _is_patched(m.fc1)


def test_accelerate_cpu_offload_model_is_left_alone():
    accelerate = pytest.importorskip("accelerate")
    m = _net()
    x = _x((4, 16))
    want = m(x)
    accelerate.cpu_offload(m, execution_device=torch.device("cpu"))
    cudal2.patch(m)
    assert not any(_is_patched(l) for l in _linears(m))
    assert torch.equal(m(x), want)


def test_forward_hooks_still_run_on_a_patched_layer(kernels):
    lin = torch.nn.Linear(16, 8).half()
    calls = []
    lin.register_forward_pre_hook(lambda mod, args: calls.append("pre"))
    lin.register_forward_hook(lambda mod, args, out: calls.append("post") or out * 0)
    cudal2.patch(lin)
    with torch.no_grad():
        y = lin(_x((4, 16), F16))
    assert calls == ["pre", "post"] and len(kernels) == 1
    assert torch.equal(y, torch.zeros(4, 8, dtype=F16))


# -- torch's answer runs the layer's own forward -------------------------------------------------
def test_where_dispatch_answers_torch_f_linear_runs_with_its_bias(torch_dispatch, linear_spy):
    lin = torch.nn.Linear(16, 32).half()
    x = _x((2, 3, 16), F16)
    cudal2.patch(lin)
    with torch.no_grad():
        y = lin(x)
    assert resolve.serving[(-1, 6, 32, 16, "RC")] is resolve.TORCH
    assert len(linear_spy) == 1
    shape, w, b = linear_spy[0]
    assert shape == (2, 3, 16) and w is lin.weight and b is lin.bias   # fused bias, not mm + add
    assert torch.equal(y, linear(x, lin.weight, lin.bias))


def test_where_a_kernel_serves_it_adds_the_bias(kernels, linear_spy):
    lin = cudal2.patch(torch.nn.Linear(16, 32).half())
    x = _x((5, 16), F16)
    with torch.no_grad():
        y = lin(x)
    assert linear_spy == [] and len(kernels) == 1
    want = x.float() @ lin.weight.float().t() + lin.bias.float()
    assert torch.allclose(y.float(), want, atol=2e-2, rtol=2e-2)


def test_autograd_through_a_patched_layer_on_fake_cuda(torch_dispatch):
    torch.manual_seed(0)
    lin, ref = torch.nn.Linear(16, 8).half(), torch.nn.Linear(16, 8).half()
    ref.load_state_dict(lin.state_dict())
    cudal2.patch(lin)
    x = _x((4, 16), F16)
    lin(x).float().sum().backward()
    ref(x).float().sum().backward()
    for p, q in zip(lin.parameters(), ref.parameters()):
        assert torch.allclose(p.grad.float(), q.grad.float(), atol=1e-2, rtol=1e-2)


# -- knobs -----------------------------------------------------------------------------------------
def test_disable_makes_patch_a_no_op(monkeypatch, kernels):
    monkeypatch.setenv("CUDAL2_DISABLE", "1")
    m = _net(F16)
    assert cudal2.patch(m) is m
    assert all("forward" not in l.__dict__ for l in _linears(m))
    with cudal2.patched(m), torch.no_grad():
        m(_x((4, 16), F16))
    assert kernels == []
    monkeypatch.setenv("CUDAL2_DISABLE", "0")
    assert all(_is_patched(l) for l in _linears(cudal2.patch(m)))
    monkeypatch.setenv("CUDAL2_DISABLE", "1")     # set after patch(): read per call, F.linear runs
    x = _x((4, 16), F16)
    with torch.no_grad():
        assert torch.equal(m.fc1(x), linear(x, m.fc1.weight, m.fc1.bias))
    assert kernels == []


BOGUS = [("CUDAL2_DISABLE", "true"), ("CUDAL2_DISABLE", "bogus"), ("CUDAL2_DISABLE", "2"),
         ("CUDAL2_PDL", "yes"), ("CUDAL2_BUILD_IN_CALL", "on"), ("CUDAL2_ARCH", "sm_75"),
         ("CUDAL2_ARCH", "sm_90"), ("CUDAL2_LOG", "verbose"), ("CUDAL2_BUILD_JOBS", "many"),
         ("CUDAL2_BUILD_JOBS", "0"), ("CUDAL2_FAKE_DEVICE", "fast"), ("CUDAL2_FAKE_DEVICE", "-1")]


@pytest.mark.parametrize("name,value", BOGUS, ids=[f"{n}={v}" for n, v in BOGUS])
def test_a_bogus_knob_value_is_an_error_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name) as err:
        knobs.check_env()
    assert "\n" not in str(err.value) and repr(value) in str(err.value)
    m = _net()
    with pytest.raises(ValueError, match=name):
        cudal2.patch(m)
    assert all("forward" not in l.__dict__ for l in _linears(m))


def test_a_bogus_disable_fails_the_hot_path_too(monkeypatch, fake_cuda):
    monkeypatch.setenv("CUDAL2_DISABLE", "yes")
    with pytest.raises(ValueError, match="CUDAL2_DISABLE must be 0 or 1, got 'yes'"):
        hot.disabled()
    a = _x((8, 8), F16)
    with pytest.raises(ValueError, match="CUDAL2_DISABLE"):
        cudal2.matmul(a, a)


def test_an_unknown_cudal2_name_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("CUDAL2_DISABLED", "1")
    with pytest.raises(ValueError, match="CUDAL2_DISABLED") as err:
        knobs.check_env()
    msg = str(err.value)
    assert "did you mean CUDAL2_DISABLE?" in msg and "CUDAL2_CACHE" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="CUDAL2_DISABLED"):
        cudal2.patch(_net())


GOOD = [("CUDAL2_DISABLE", "0"), ("CUDAL2_DISABLE", ""), ("CUDAL2_PDL", "1"),
        ("CUDAL2_BUILD_IN_CALL", "0"), ("CUDAL2_ARCH", "sm_90a"), ("CUDAL2_LOG", "DEBUG"),
        ("CUDAL2_BUILD_JOBS", "4"), ("CUDAL2_FAKE_DEVICE", "0.1"), ("CUDAL2_CACHE", "/tmp/c"),
        ("CUDAL2_CALL_GUARD", "0"), ("CUDAL2_TEST_PACK", "/tmp/pack")]


@pytest.mark.parametrize("name,value", GOOD, ids=[f"{n}={v}" for n, v in GOOD])
def test_good_knob_values_pass(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    knobs.check_env()
    assert all(_is_patched(l) for l in _linears(cudal2.patch(_net())))


def test_knob_accessors_read_strictly(monkeypatch):
    monkeypatch.setenv("CUDAL2_LOG", "Info")
    assert knobs.log_level() == "info"
    monkeypatch.setenv("CUDAL2_ARCH", "sm_80")
    assert knobs.default_arch() == "sm_80"
    monkeypatch.setenv("CUDAL2_DISABLE", " 1 ")
    assert knobs.disabled() is True and hot.disabled() is True


def test_check_env_reads_the_mapping_it_is_given(monkeypatch):
    monkeypatch.setenv("CUDAL2_LOG", "loud")
    knobs.check_env({"PATH": "/bin", "CUDAL2_LOG": "info"})
    with pytest.raises(ValueError, match="CUDAL2_PDL must be 0 or 1, got 'x'"):
        knobs.check_env({"CUDAL2_PDL": "x"})
    with pytest.raises(ValueError, match="CUDAL2_LOG"):
        knobs.check_env()
