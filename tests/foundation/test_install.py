"""The install leaves the CPU environment usable, and our `kernels` package never poses as HF's."""

import subprocess
import sys

import torch


def run_py(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_timm_torchvision_and_accelerate_import():
    out = run_py("import timm, torchvision.transforms.v2, accelerate.commands.launch; print('ok')")
    assert out.strip() == "ok"


def test_torchvision_hook_is_cpu_only():
    # The hook only declares schemas when torch has no CUDA; on a CUDA build it must do nothing.
    out = run_py(
        "import sys, torch, torchvision; "
        "print(torch.version.cuda is None, '_kvl_torchvision_cpu_fix' in sys.modules)"
    )
    is_cpu, hooked = out.split()
    assert is_cpu == str(torch.version.cuda is None)
    assert hooked == is_cpu, "the hook must be installed exactly when torch is a CPU build"


def test_hf_does_not_see_our_kernels_package_as_hub_kernels():
    code = (
        "import sys\n"
        "from transformers.utils import is_kernels_available\n"
        "assert not is_kernels_available(), 'transformers thinks the HF kernels project is installed'\n"
        "import torch\n"
        "from transformers import KimiLinearConfig, KimiLinearForCausalLM\n"
        "cfg = KimiLinearConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
        "    num_attention_heads=2, num_key_value_heads=2, layer_types=['linear_attention', 'full_attention'],\n"
        "    mlp_layer_types=['dense', 'dense'], linear_head_dim=16, linear_num_heads=2,\n"
        "    q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,\n"
        "    pad_token_id=0, bos_token_id=1, eos_token_id=2)\n"
        "m = KimiLinearForCausalLM(cfg)\n"
        "m(torch.tensor([[1, 2, 3]]))\n"
        "print('kernels' in sys.modules)\n"
    )
    assert run_py(code).strip() == "False"
