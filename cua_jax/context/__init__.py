"""Episodes to training items: token streams, chat rendering, context segmentation.

tokenizer      load_tokenizer / load_processor / build_image_processor / save_tokenizer_and_processor,
               special_token_ids, image_grid_thw: the shipped tiny Qwen3-VL-layout tokenizer
               (or any real Qwen3-VL directory) and the PIL Qwen-VL image processor
render         ChatRenderer (messages -> ids with expanded image pads), History, ImageRef
token_stream   TokenStream, TokenStreamBuilder (ScaleCUA Alg. 2 diffs), Prompt, PrefixMismatchError
segment        SlidingWindow, StepWise, CompactContext, WholeTrajectory, make_segmenter;
               segmenter.start(...) drives a live rollout, segmenter.segment(episode) replays one
"""
