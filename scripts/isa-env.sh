# Sourced by the bench scripts: holding either side of a comparison to one
# instruction set, so that a CPU with AVX-512 can compare AVX2 with AVX2.
# A run or mode written NAME:ISA runs NAME under ISA.
#
# bertha: BERTHA_ISA. PyTorch: its own kernels (ATEN_CPU_CAPABILITY), MKL's
# (MKL_ENABLE_INSTRUCTIONS: its fp32 products) and oneDNN's
# (ONEDNN_MAX_CPU_ISA: its bf16 products). On AMD CPUs MKL runs its AVX2
# products even where the CPU has AVX-512 (a 2048³ product reads ~190
# GFLOP/s on a Zen 5 whose ymm FMA peak is ~230 and zmm peak ~470), so
# there only PyTorch's own kernels change. ONNX Runtime has no such switch.

# The ISA of NAME:ISA, or nothing.
isa_of() { if [[ "$1" == *:* ]]; then echo "${1#*:}"; fi; }

# The environment holding bertha to an ISA (none for "").
bertha_isa_env() { if [ -n "$1" ]; then echo "BERTHA_ISA=$1"; fi; }

# The environment holding PyTorch to an ISA (none for "").
torch_isa_env() {
    case "$1" in
        "") ;;
        avx2) echo "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2" ;;
        *)
            echo "PyTorch cannot be held to \"$1\" (only avx2)" >&2
            return 2
            ;;
    esac
}
