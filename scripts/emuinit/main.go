//go:build linux && amd64

// Command emuinit is the init (PID 1) of the initramfs that scripts/emu-avx512
// boots under Bochs to run an amd64 program on an emulated AVX-512 CPU.
//
// It mounts /proc, /sys, /dev (devtmpfs) and /tmp, makes the serial console
// its standard output, shows the CPU as the guest kernel and Go see it (the
// AVX-512 flags of /proc/cpuinfo, the kernel's x86/fpu lines, XCR0, and one
// ZMM instruction executed), then runs /emu/prog with the arguments in
// /emu/args (NUL-separated) in the directory /emu/dir (or /tmp where the
// initramfs has none), its standard output and error on the console. It
// ends with the line
//
//	EMU-EXIT <status>
//
// (128+signal where the program was killed by a signal, 255 where it could
// not be started) and powers the machine off. Every line it writes itself
// starts with "EMU-", which the script reads; the program's own output lies
// between the lines "EMU-BEGIN" and "EMU-EXIT".
//
// Build it static: CGO_ENABLED=0 go build ./scripts/emuinit.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// Paths inside the initramfs that scripts/emu-avx512 writes.
const (
	progPath = "/emu/prog"
	argsPath = "/emu/args"
	dirPath  = "/emu/dir"
)

// xgetbv returns XCR0, the state components the kernel enabled with XSETBV
// (bits 5-7: the AVX-512 opmask, ZMM_Hi256 and Hi16_ZMM state).
func xgetbv() uint64

// zmmAdd adds a and b as 16 uint32 lanes with VPADDD on ZMM registers,
// under an opmask of all ones, and stores the sum in out.
func zmmAdd(a, b, out *[16]uint32)

func main() {
	errs := mountAll()
	console()
	say("EMU-INIT")
	for _, err := range errs {
		say("EMU-MOUNT %v", err)
	}
	showCPU()
	status := run()
	say("EMU-EXIT %d", status)
	drain()
	syscall.Sync()
	if err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		say("EMU-POWEROFF failed: %v", err)
	}
	// PID 1 must not exit (the kernel would panic); the script stops Bochs
	// once it has read EMU-EXIT.
	for {
		time.Sleep(time.Hour)
	}
}

// mountAll mounts the pseudo file systems a Go test binary may look at. It
// returns its errors for later: the console is not open yet.
func mountAll() []error {
	var errs []error
	for _, m := range []struct{ src, dir, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
	} {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := syscall.Mount(m.src, m.dir, m.fstype, 0, ""); err != nil {
			errs = append(errs, fmt.Errorf("mount %s on %s: %w", m.fstype, m.dir, err))
		}
	}
	return errs
}

// console makes /dev/console standard input, output and error, and turns
// off output processing (no \n to \r\n), so the program's bytes reach the
// console file unchanged.
func console() {
	f, err := os.OpenFile("/dev/console", os.O_RDWR, 0)
	if err != nil {
		return // the kernel's console, if it opened one, stays
	}
	for fd := 0; fd <= 2; fd++ {
		syscall.Dup3(int(f.Fd()), fd, 0)
	}
	var t syscall.Termios
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, 1, syscall.TCGETS, uintptr(unsafe.Pointer(&t))); e == 0 {
		t.Oflag &^= syscall.OPOST
		syscall.Syscall(syscall.SYS_IOCTL, 1, syscall.TCSETS, uintptr(unsafe.Pointer(&t)))
	}
}

// drain waits until the console has sent everything written to it: the
// serial port is slow, and powering off would cut the output short.
func drain() {
	const tcsbrk = 0x5409 // TCSBRK; with 1: tcdrain
	syscall.Syscall(syscall.SYS_IOCTL, 1, tcsbrk, 1)
}

// say writes one line of the init's own to the console.
func say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// showCPU prints the CPU as the guest sees it: the model, the AVX-512 flags
// that Linux reports (it clears them where the XSAVE state is missing), the
// kernel's XSAVE lines, XCR0, and the result of one ZMM addition.
func showCPU() {
	if info, err := os.ReadFile("/proc/cpuinfo"); err != nil {
		say("EMU-CPU /proc/cpuinfo: %v", err)
	} else {
		var model string
		var avx []string
		for _, line := range strings.Split(string(info), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				model = strings.TrimSpace(v)
			case "flags":
				avx = avx[:0]
				for _, f := range strings.Fields(v) {
					if strings.HasPrefix(f, "avx") {
						avx = append(avx, f)
					}
				}
			}
		}
		say("EMU-CPU %s", model)
		say("EMU-FLAGS %s", strings.Join(avx, " "))
	}
	// The kernel's log (its x86/fpu lines name each XSAVE component).
	buf := make([]byte, 1<<20)
	if n, err := syscall.Klogctl(3, buf); err == nil { // SYSLOG_ACTION_READ_ALL
		for _, line := range bytes.Split(buf[:n], []byte("\n")) {
			if i := bytes.Index(line, []byte("x86/fpu:")); i >= 0 {
				say("EMU-KERNEL %s", line[i:])
			}
		}
	}
	xcr0 := xgetbv()
	if xcr0&0xe6 != 0xe6 {
		say("EMU-XCR0 %#x (opmask/ZMM state NOT enabled)", xcr0)
		return // VPADDD on ZMM would fault
	}
	say("EMU-XCR0 %#x (opmask/ZMM state enabled)", xcr0)
	var a, b, sum [16]uint32
	for i := range a {
		a[i], b[i] = uint32(i), uint32(100*i)
	}
	zmmAdd(&a, &b, &sum)
	ok := true
	for i := range sum {
		ok = ok && sum[i] == uint32(101*i)
	}
	if ok {
		say("EMU-ZMM VPADDD on ZMM registers: ok")
	} else {
		say("EMU-ZMM VPADDD on ZMM registers: WRONG RESULT %v", sum)
	}
}

// run runs the program and returns its exit status.
func run() int {
	var args []string
	if raw, err := os.ReadFile(argsPath); err == nil && len(raw) > 0 {
		args = strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	}
	dir := dirPath
	if _, err := os.Stat(dir); err != nil {
		dir = "/tmp"
	}
	// One pipe for standard output and error keeps their order; the copy
	// to the console notes whether the output ended its last line.
	r, w, err := os.Pipe()
	if err != nil {
		say("EMU-ERROR %v", err)
		return 255
	}
	cmd := exec.Command(progPath, args...)
	cmd.Dir = dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, w, w
	cmd.Env = []string{"PATH=/emu:/bin", "HOME=/tmp", "TMPDIR=/tmp"}
	say("EMU-BEGIN")
	copied := make(chan byte)
	go func() {
		last := byte('\n')
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				os.Stdout.Write(buf[:n])
				last = buf[n-1]
			}
			if err != nil {
				copied <- last
				return
			}
		}
	}()
	err = cmd.Start()
	w.Close()
	if err == nil {
		err = cmd.Wait()
	}
	if <-copied != '\n' {
		os.Stdout.WriteString("\n")
		say("EMU-NOEOL") // the output's last line had no newline: one was added
	}
	if err == nil {
		return 0
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			say("EMU-SIGNAL %v", ws.Signal())
			return 128 + int(ws.Signal())
		}
		return exit.ExitCode()
	}
	say("EMU-ERROR %v", err)
	return 255
}
