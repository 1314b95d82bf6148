//go:build !linux

package main

// releaseStartupPages does nothing off Linux.
func releaseStartupPages() {}
