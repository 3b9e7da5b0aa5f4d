# Moat's developer entry points. The README's two commands work without make.
.PHONY: build images test generate verify bench demo

build:
	go build -o bin/ ./cmd/...
	ln -sf moat bin/kubectl-moat
	ln -sf moat bin/kubectl_complete-moat

# The three container images, without a registry (docs/install.md).
images:
	./hack/image/build.sh dev

test:
	./hack/test.sh

generate:
	./hack/update-codegen.sh

verify:
	./hack/verify-codegen.sh

bench:
	go test -run '^$$' -bench . -benchmem ./...

demo:
	./hack/demo.sh
