package proc

import (
	"os"
	"testing"
	"time"
)

func TestThisProcessHasMemoryAndCPU(t *testing.T) {
	m, err := MemoryOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS <= 0 || m.HWM < m.RSS || m.Anon <= 0 {
		t.Errorf("memory %+v: want RSS > 0, HWM >= RSS, RssAnon > 0", m)
	}
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	if cpu, err := CPU(os.Getpid()); err != nil || cpu <= 0 {
		t.Errorf("CPU %s, %v: want some after 50 ms of spinning", cpu, err)
	}
	if _, err := CapEff(os.Getpid()); err != nil {
		t.Error(err)
	}
}

func TestAProcessThatIsGoneIsAnError(t *testing.T) {
	const none = 1 << 30 // above pid_max
	if _, err := MemoryOf(none); err == nil {
		t.Error("MemoryOf: no error")
	}
	if _, err := CPU(none); err == nil {
		t.Error("CPU: no error")
	}
	if s := CPUSeconds(none); s != 0 {
		t.Errorf("CPUSeconds %v, want 0", s)
	}
}
