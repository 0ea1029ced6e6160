"""Experiments that train, evaluate and draw: model families compared on one budget, BLEU by source length."""
