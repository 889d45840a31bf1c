module github.com/rvma/rvma

go 1.26.0

require (
	github.com/klauspost/reedsolomon v1.14.2
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.49.0
)

require (
	github.com/klauspost/cpuid/v2 v2.3.0 // indirect
	github.com/zeebo/blake3 v0.2.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
