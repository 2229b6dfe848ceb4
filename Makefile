# bytecode written once first: with PYTHONDONTWRITEBYTECODE=1 every CLI run of the tests would compile it again
test:
	python -m compileall -q ckpt_tui
	python -m pytest

lint:
	ruff check ckpt_tui tests benchmarks scripts
	ruff format --check ckpt_tui tests benchmarks scripts
	mypy
	lint-imports

bench:
	cd benchmarks && for bench in bench_*.py; do echo "== $$bench"; python $$bench || exit 1; done

.PHONY: test lint bench
