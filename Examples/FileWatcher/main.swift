// A file watcher: `for await` over a FileSystemSource's events prints what
// happens to a file — written, extended, renamed, deleted — until it is
// deleted. A writer task makes the changes.
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

let path = "/tmp/gcd-file-watcher-\(getpid()).txt"
let renamed = path + ".renamed"
let descriptor = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0o644)
guard descriptor >= 0 else { fatalError("cannot create \(path)") }

let watcher = try FileSystemSource(path: path, events: [.write, .extend, .rename, .delete], queue: .global())
// Runs once the source watches the file: then start changing it.
watcher.setRegistrationHandler {
  _ = write(descriptor, "first line\n", 11)
}

var seen: FileSystemEvents = []
var step = 0
for try await events in watcher.makeEvents() {
  print("events: \(events)")
  seen.formUnion(events)
  step += 1
  // Each change waits for the previous event, so every step is observed.
  switch step {
  case 1: rename(path, renamed)
  case 2:
    print("the source follows the file to its new name: \(watcher.path ?? "?")")
    unlink(renamed)
  default: break
  }
  if events.contains(.delete) { break }  // leaving the loop cancels the source
}
close(descriptor)
print("the watched file was written, renamed and deleted")
if !seen.isSuperset(of: [.write, .rename, .delete]) {
  print("FAILED: saw only \(seen)")
  exit(1)
}
