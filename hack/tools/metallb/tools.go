//go:build tools

// Package tools pins MetalLB's API module, whose Go types controller-gen turns into MetalLB's
// CRDs for the migration tests (test/migration): nothing of MetalLB's repository is copied.
package tools

import (
	_ "go.universe.tf/metallb/api/v1beta1"
	_ "go.universe.tf/metallb/api/v1beta2"
)
