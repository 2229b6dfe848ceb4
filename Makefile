test:
	python -m pytest

lint:
	ruff check ckpt_tui tests benchmarks scripts
	ruff format --check ckpt_tui tests benchmarks scripts
	mypy
	lint-imports

bench:
	cd benchmarks && python bench_open.py && python bench_convert.py

.PHONY: test lint bench
