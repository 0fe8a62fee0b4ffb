"""vLLM's own Qwen3-VL and Qwen3.5 models served without torchvision (CPU builds).

vLLM's Qwen3-VL module (which its Qwen3.5 module imports) imports transformers'
torchvision-backed `Qwen2VLImageProcessor` at import time, and its processor always builds
the (torchvision-only) video processor.
On CPU, torchvision is left out: PyPI's build does not match torch 2.13+cpu. The model
itself needs neither. `register_image_only_qwen3_vl()` makes vLLM serve it with images:

* the image-processor module name resolves to transformers' PIL backend
  (`Qwen2VLImageProcessorPil`, the same resize and normalisation without torchvision),
  through an import hook that steps aside whenever torchvision is importable;
* `Qwen3VLForConditionalGeneration` is registered as a subclass of vLLM's own class (same
  layers, same weight loading) whose processing info declares the image modality only and
  builds the HF processor from the PIL image processor and the tokenizer, without a video
  processor; so is `Qwen3_5ForConditionalGeneration`, and vLLM's `Qwen3_5ForCausalLM` (text
  only) by its own class.

The hook lives in the calling process, so the engine must run in-process (no engine-core
subprocess, the "uni" executor): `VllmEngine` does that when `needs_image_only_qwen3_vl`
says so. Registering the class object (not a module path) keeps vLLM from inspecting the
architecture in a fresh interpreter, where the hook would be missing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading

_TORCHVISION_PROCESSOR = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PIL_PROCESSOR = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
_lock = threading.Lock()
_registered = False


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


# The architectures whose vLLM modules import vLLM's Qwen3-VL module (Qwen3.5 builds on it), and
# the vision-language ones among them, served with the image-only processing below.
SERVED_WITHOUT_TORCHVISION = (
    "Qwen3VLForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM",
)
VISION_LANGUAGE = ("Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration")


def needs_image_only_qwen3_vl(architectures) -> bool:
    """Whether serving these architectures needs `register_image_only_qwen3_vl` here."""
    return any(a in SERVED_WITHOUT_TORCHVISION for a in (architectures or ())) and not torchvision_available()


class _PilImageProcessorModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves the torchvision image-processor module to the PIL one (torchvision absent)."""

    def find_spec(self, name, path=None, target=None):
        if name != _TORCHVISION_PROCESSOR or torchvision_available():
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        pil = importlib.import_module(_PIL_PROCESSOR)
        module.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil


def register_image_only_qwen3_vl() -> None:
    """Install the import hook and register, with vLLM, the image-only Qwen3-VL and Qwen3.5 and
    vLLM's own Qwen3.5 text model by their class objects (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        if not any(isinstance(f, _PilImageProcessorModule) for f in sys.meta_path):
            sys.meta_path.insert(0, _PilImageProcessorModule())
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        from transformers.models.qwen3_vl import Qwen3VLProcessor
        from vllm import ModelRegistry
        from vllm.model_executor.models import qwen3_5, qwen3_vl
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.multimodal.processing.context import BaseProcessingInfo

        class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
            """Qwen3VLProcessor without a video processor (None is refused by the base check)."""

            def check_argument_for_proper_class(self, argument_name, argument):
                if argument_name == "video_processor" and argument is None:
                    return None
                return super().check_argument_for_proper_class(argument_name, argument)

        def image_only(info_base):
            """`info_base` (a Qwen3-VL processing info) with the image modality only, and its HF
            processor built from the PIL image processor and the tokenizer."""

            class ImageOnlyProcessingInfo(info_base):
                def get_supported_mm_limits(self):
                    return {"image": None}

                def get_supported_mm_processor_kwargs(self):
                    # The base's: the Qwen3-VL override adds video kwargs to a scope that is absent here.
                    return BaseProcessingInfo.get_supported_mm_processor_kwargs(self)

                def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
                    return {"image": self.get_max_image_tokens()}

                def get_hf_processor(self, **kwargs):
                    if self.__dict__.get("_image_only_processor") is None:
                        image_processor = Qwen2VLImageProcessorPil.from_pretrained(self.ctx.model_config.model)
                        self.__dict__["_image_only_processor"] = ImageOnlyQwen3VLProcessor(
                            image_processor=image_processor, tokenizer=self.get_tokenizer(), video_processor=None
                        )
                    return self.__dict__["_image_only_processor"]

            return ImageOnlyProcessingInfo

        @MULTIMODAL_REGISTRY.register_processor(
            qwen3_vl.Qwen3VLMultiModalProcessor,
            info=image_only(qwen3_vl.Qwen3VLProcessingInfo),
            dummy_inputs=qwen3_vl.Qwen3VLDummyInputsBuilder,
        )
        class ImageOnlyQwen3VLForConditionalGeneration(qwen3_vl.Qwen3VLForConditionalGeneration):
            """vLLM's Qwen3-VL, registered with the image-only processing above."""

        @MULTIMODAL_REGISTRY.register_processor(
            qwen3_vl.Qwen3VLMultiModalProcessor,
            info=image_only(qwen3_5.Qwen3_5ProcessingInfo),
            dummy_inputs=qwen3_vl.Qwen3VLDummyInputsBuilder,
        )
        class ImageOnlyQwen3_5ForConditionalGeneration(qwen3_5.Qwen3_5ForConditionalGeneration):
            """vLLM's Qwen3.5, registered with the image-only processing above."""

        ModelRegistry.register_model("Qwen3VLForConditionalGeneration", ImageOnlyQwen3VLForConditionalGeneration)
        ModelRegistry.register_model("Qwen3_5ForConditionalGeneration", ImageOnlyQwen3_5ForConditionalGeneration)
        # The text model needs no processor; registered by its class so that vLLM does not
        # import its module (which imports Qwen3-VL's) in a fresh interpreter without the hook.
        ModelRegistry.register_model("Qwen3_5ForCausalLM", qwen3_5.Qwen3_5ForCausalLM)
        _registered = True
