"""Episodes to training items: token streams, chat rendering, context segmentation."""
