import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

extension PressureTests {
  /// `PressureSource` on Linux: a PSI trigger in an epoll descriptor of its
  /// own, watched by a libdispatch read source; real CPU pressure from busy
  /// children in a cgroup of their own; every refusal thrown; two descriptors
  /// per source, closed once.
  @Suite
  struct PressureSourceTests {
    // Needs PSI (the kernel's pressure files), root (to make a cgroup and move
    // processes) and a cgroup v2 hierarchy; skipped otherwise, never passed.
    @Test(
      "busy children in a cgroup cross a CPU stall threshold", .enabled(if: canMakeCPUPressure, needsCPUPressure),
      .timeLimit(.minutes(1)))
    func cpuPressureFires() async throws {
      let cgroup = try TestCgroup(under: unifiedCgroupMount!)
      defer { cgroup.remove() }
      let scope = PressureScope.cgroup(cgroup.path)
      let source = try PressureSource(
        resource: .cpu, stall: .some, threshold: .milliseconds(100), window: .seconds(2), scope: scope,
        queue: Queue(label: "pressure"))
      #expect(source.resource == .cpu)
      #expect(source.stall == .some)
      #expect(source.threshold == .milliseconds(100))
      #expect(source.window == .seconds(2))
      #expect(source.scope == scope)
      // Three busy loops on (at most) two CPUs: each waits for a CPU a third of the time or more.
      var busy: [pid_t] = []
      defer { busy.forEach(killAndReap) }
      for _ in 0..<3 { busy.append(try spawnInCgroups([cgroup], "while :; do :; done")) }
      var fires: UInt = 0
      for try await count in source.makeEvents() {
        fires = count
        break
      }
      #expect(fires >= 1)
      #expect(source.isCancelled, "leaving the loop cancels the source")
    }

    @Test(
      "a trigger that never fires delivers nothing", .enabled(if: canMakeCPUPressure, needsCPUPressure),
      .timeLimit(.minutes(1)))
    func quietCgroupDoesNotFire() async throws {
      let cgroup = try TestCgroup(under: unifiedCgroupMount!)
      defer { cgroup.remove() }
      let source = try PressureSource(
        resource: .memory, threshold: .milliseconds(100), window: .seconds(2), scope: .cgroup(cgroup.path),
        queue: Queue(label: "pressure"))
      let fired = Event()
      source.setEventHandler { fired.signal() }
      source.resume()
      // An empty cgroup never stalls.
      #expect(!(await eventually(timeout: .seconds(3)) { fired.isSignaled }))
      source.cancel()
    }

    @Test(
      "a removed cgroup ends the trigger without spinning", .enabled(if: canMakeCPUPressure, needsCPUPressure),
      .timeLimit(.minutes(1)))
    func removedCgroupStopsFiring() async throws {
      let cgroup = try TestCgroup(under: unifiedCgroupMount!)
      let source = try PressureSource(
        resource: .cpu, threshold: .milliseconds(100), window: .seconds(2), scope: .cgroup(cgroup.path),
        queue: Queue(label: "pressure"))
      let count = Counter()
      source.setEventHandler { count.increment() }
      source.resume()
      #expect(cgroup.remove())
      #expect(!(await eventually(timeout: .seconds(1)) { count.current > 0 }), "a removed file is not a fire")
      let cancelled = Event()
      source.setCancelHandler { cancelled.signal() }
      source.cancel()
      #expect(await eventually { cancelled.isSignaled })
    }

    @Test("every input the package or the kernel refuses throws", .enabled(if: pressureAvailable, needsPSI))
    func badInputsThrow() throws {
      let queue = Queue(label: "pressure")
      func refusal(
        _ threshold: Duration, _ window: Duration, scope: PressureScope = .system,
        resource: PressureSource.Resource = .cpu
      ) -> GCDError? {
        do {
          _ = try PressureSource(resource: resource, threshold: threshold, window: window, scope: scope, queue: queue)
          return nil
        } catch {
          return error
        }
      }
      let refusedByThePackage: [(Duration, Duration)] = [
        (.zero, .seconds(2)), (.nanoseconds(999), .seconds(2)), (.milliseconds(-5), .seconds(2)),
        (.seconds(Int64.max), .seconds(2)), (.milliseconds(100), .seconds(Int64.max)),
        (.milliseconds(100), .seconds(Int64.min)), (.milliseconds(100), .zero),
      ]
      let refusedByTheKernel: [(Duration, Duration)] = [
        (.milliseconds(100), .milliseconds(400)),  // window under 500 ms
        (.milliseconds(100), .seconds(12)),  // window over 10 s
        (.seconds(3), .seconds(2)),  // threshold longer than the window
      ]
      for (threshold, window) in refusedByThePackage + refusedByTheKernel {
        let error = refusal(threshold, window)
        #expect(error?.errno == EINVAL, "threshold \(threshold), window \(window)")
        #expect(error?.operation.hasPrefix("PressureSource(resource: .cpu") == true)
        #expect(error?.detail?.contains("500 ms to 10 s") == true, "the kernel's rules are in the message")
      }
      if !processHasSystemResourceCapability {
        let error = refusal(.milliseconds(100), .seconds(3))
        #expect(error?.errno == EINVAL)
        #expect(error?.detail?.contains("lacks CAP_SYS_RESOURCE") == true)
      }
      let missing = refusal(.milliseconds(100), .seconds(2), scope: .cgroup("/nonexistent/gcd-cgroup"))
      #expect(missing?.errno == ENOENT)
      #expect(missing?.detail?.contains("/nonexistent/gcd-cgroup/cpu.pressure") == true)
    }

    @Test("a cgroup with PSI switched off throws ENOENT", .enabled(if: canMakeCPUPressure, needsCPUPressure))
    func cgroupWithPressureOff() throws {
      let cgroup = try TestCgroup(under: unifiedCgroupMount!)
      defer { cgroup.remove() }
      guard access(cgroup.path + "/cgroup.pressure", F_OK) == 0 else { return }
      try cgroup.write("0", to: "cgroup.pressure")
      let error = #expect(throws: GCDError.self) {
        try PressureSource(
          resource: .io, threshold: .milliseconds(100), window: .seconds(2), scope: .cgroup(cgroup.path),
          queue: Queue(label: "pressure"))
      }
      #expect(error?.errno == ENOENT || error?.errno == EOPNOTSUPP)
    }

    // Needs root (to make the cgroup and drop to another user) and cgroup v2.
    @Test("a pressure file this user cannot write throws EACCES", .enabled(if: canMakeCPUPressure, needsCPUPressure))
    func unwritableFileThrowsPermissionDenied() async throws {
      let cgroup = try TestCgroup(under: unifiedCgroupMount!, name: "eacces")
      defer { cgroup.remove() }
      let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        // In the child (spawned by this test process): the cgroup the parent made, root's, mode 0644 files.
        let name = unifiedCgroupMount! + "/gcd-test-\(getppid())-eacces"
        childCheck(setgid(65534) == 0 && setuid(65534) == 0, "setuid: errno \(errno)")
        do {
          _ = try PressureSource(
            resource: .cpu, threshold: .milliseconds(100), window: .seconds(2), scope: .cgroup(name),
            queue: Queue(label: "pressure"))
          endChild("failed: no error")
        } catch let error as GCDError {
          childCheck(error.errno == EACCES || error.errno == EPERM, "\(error)")
          childCheck(error.detail?.contains("open for writing") == true, "\(error)")
          endChild("ok")
        } catch {
          endChild("failed: \(error)")
        }
      }
      #expect(standardError(of: result).contains("exit-test child: ok"), "\(standardError(of: result))")
    }

    @Test("dropping in every state closes both descriptors", .enabled(if: pressureAvailable, needsPSI))
    func droppingInEveryStateIsSafe() throws {
      // The system's I/O file: no other test here uses it.
      let path = PressureScope.system.path(of: .io)
      func count() -> Int { pressureDescriptorCount(of: path) }
      let baseline = count()
      let queue = Queue(label: "pressure")
      func make() throws -> PressureSource {
        try PressureSource(
          resource: .io, stall: .full, threshold: .milliseconds(500), window: .seconds(2), scope: .system, queue: queue)
      }
      do {
        let held = try make()
        #expect(count() == baseline + 2, "the trigger and its epoll descriptor")
        #expect(held.handle > 2)
      }
      #expect(pollUntil { count() == baseline }, "never started")
      do {
        let started = try make()
        started.setEventHandler {}
        started.resume()
      }
      #expect(pollUntil { count() == baseline }, "started")
      do {
        let suspended = try make()
        suspended.resume()
        suspended.suspend()
        suspended.suspend()
      }
      #expect(pollUntil { count() == baseline }, "suspended")
      do {
        let inactiveSuspended = try make()
        inactiveSuspended.suspend()
      }
      #expect(pollUntil { count() == baseline }, "suspended before start")
      let cancelledOnce = Counter()
      do {
        let cancelled = try make()
        let done = Event()
        cancelled.setCancelHandler {
          cancelledOnce.increment()
          done.signal()
        }
        cancelled.resume()
        cancelled.cancel()
        cancelled.cancel()
        #expect(done.wait())
      }
      #expect(pollUntil { count() == baseline }, "cancelled")
      #expect(cancelledOnce.current == 1)
      for _ in 0..<50 {
        let source = try make()
        source.resume()
        source.cancel()
      }
      #expect(pollUntil { count() == baseline }, "50 started and cancelled")
    }

    @Test("the process's cgroup v2 directory is found from /proc/self/cgroup and mountinfo")
    func cgroupDirectoryParsing() {
      let unified = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
      let hybrid =
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        + "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
      func directory(_ membership: String, _ mounts: String) -> String? {
        PressureFile.cgroupDirectory(membership: membership, mountinfo: mounts)
      }
      #expect(directory("0::/app.slice/web.service\n", unified) == "/sys/fs/cgroup/app.slice/web.service")
      #expect(directory("4:memory:/x\n0::/user.slice\n", hybrid) == "/sys/fs/cgroup/unified/user.slice")
      #expect(directory("0::/\n", unified) == "/sys/fs/cgroup", "the root, or a namespace's root")
      #expect(directory("0::/a b\n", "30 23 0:26 / /mnt/cg\\040v2 rw - cgroup2 cgroup2 rw\n") == "/mnt/cg v2/a b")
      #expect(
        directory("0::/outer/inner\n", "30 23 0:26 /outer /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
          == "/sys/fs/cgroup/inner", "a bind mount of a subtree")
      #expect(directory("0::/x\n", "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") == nil)
      #expect(directory("4:memory:/x\n", unified) == nil, "cgroup v1 only")
    }

    @Test("totals are read from a pressure file's text; durations convert saturating")
    func totalsAndMicroseconds() {
      let text =
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=165871\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=42\n"
      #expect(PressureFile.totals(of: text)?.some == 165871)
      #expect(PressureFile.totals(of: text)?.full == 42)
      #expect(PressureFile.totals(of: "some avg10=0.00 total=7\n")?.full == 0, "cpu had no full line before 5.13")
      #expect(PressureFile.totals(of: "") == nil)
      #expect(PressureFile.microseconds(.milliseconds(150)) == 150_000)
      #expect(PressureFile.microseconds(.nanoseconds(1_999)) == 1)
      #expect(PressureFile.microseconds(.seconds(Int64.max)) == .max)
      #expect(PressureFile.microseconds(.seconds(Int64.min)) == .min)
    }

    @Test("the scope names the pressure file")
    func scopePaths() {
      #expect(PressureScope.system.path(of: .memory) == "/proc/pressure/memory")
      #expect(PressureScope.system.path(of: .io) == "/proc/pressure/io")
      #expect(PressureScope.cgroup("/sys/fs/cgroup/app").path(of: .cpu) == "/sys/fs/cgroup/app/cpu.pressure")
      #expect(PressureScope.cgroup("/x").description == ".cgroup(\"/x\")")
      #expect(PressureScope.system.description == ".system")
    }
  }
}

/// The process's `CapEff` has `CAP_SYS_RESOURCE` (bit 24).
let processHasSystemResourceCapability: Bool = {
  let status = String(decoding: contentsOfFile("/proc/self/status"), as: UTF8.self)
  guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("CapEff:") }),
    let bits = UInt64(line.split(separator: "\t").last ?? "", radix: 16)
  else { return false }
  return bits & (1 << 24) != 0
}()
