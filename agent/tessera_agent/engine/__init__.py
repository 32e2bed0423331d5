"""Block engine: model code, loader, paged KV cache, scheduler, runner, stages."""
