module github.com/gradcomp/gradcomp

go 1.26.8

require (
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
)
