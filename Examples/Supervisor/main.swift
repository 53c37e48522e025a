// A supervisor: it starts a child process and awaits its exit through a
// ProcSource's events (no thread blocks in waitpid meanwhile), then reaps
// it and reports how it ended.
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Starts the child, awaits its exit, reaps it; a function rather than top-level code, whose
/// async frame LeakSanitizer reports as leaking its temporaries.
func supervise() async throws {
  var pid: pid_t = 0
  let arguments = ["/bin/sh", "-c", "sleep 0.2; exit 7"]
  let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
  guard posix_spawn(&pid, "/bin/sh", nil, nil, argv, environ) == 0 else { fatalError("posix_spawn failed") }
  argv.forEach { free($0) }
  print("started child \(pid)")

  let child = try ProcSource(pid: pid, events: .exit, queue: .global())
  for try await events in child.makeEvents() where events.contains(.exit) {
    print("child \(pid) exited (\(events))")
    break
  }

  // The source does not reap: the parent still calls waitpid (it returns at once now).
  var status: Int32 = 0
  _ = waitpid(pid, &status, 0)
  let exitCode = (status >> 8) & 0xff
  print("child exit status: \(exitCode)")
  if exitCode != 7 {
    print("FAILED")
    exit(1)
  }
}

try await supervise()
