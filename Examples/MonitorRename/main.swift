// Reproduces `MonitorNameChangesToFile(filename)` ("Monitoring a File-System Object"): open the file
// for events only, make a VNODE source with `DISPATCH_VNODE_RENAME` on the default global queue, keep a
// copy of the file name as the source's context, call `MyUpdateFileName` on each rename, and free the
// name and close the descriptor in the cancel handler.
//
// On Linux: libdispatch has no vnode source (and there is no `O_EVTONLY`): `FileSystemSource` watches
// the file through the process's one inotify instance, and its `path` gives the new name after a
// rename. The example renames its temporary file twice and prints both events and the new names.

import GCD
import Glibc
import Synchronization

let events = Atomic<Int>(0)
let renamed = try! Semaphore(value: 0)
let cancelled = try! Semaphore(value: 0)

/// `MyUpdateFileName(oldFilename, fd)`: the name in the context is now stale; the source knows the
/// new one. Replaces the context's copy.
func myUpdateFileName(_ source: FileSystemSource, _ fd: Int32) {
  let oldFilename = String(cString: source.context!.assumingMemoryBound(to: CChar.self))
  let newFilename = source.path ?? "(unknown)"
  let event = events.add(1, ordering: .relaxed).newValue
  print(
    "event \(event): \(FileSystemEvents(rawValue: source.data)) on descriptor \(fd): "
      + "\(basename(oldFilename)) -> \(basename(newFilename))")
  free(source.context)
  source.context = UnsafeMutableRawPointer(strdup(newFilename))
  renamed.signal()
}

func basename(_ path: String) -> String { String(path.split(separator: "/").last ?? "") }

/// `MonitorNameChangesToFile(filename)`.
func monitorNameChangesToFile(_ filename: String) -> FileSystemSource? {
  let fd = open(filename, O_RDONLY | O_CLOEXEC)  // O_EVTONLY has no Linux equivalent
  if fd == -1 { return nil }

  let queue = Queue.global(.default)
  guard let source = try? FileSystemSource(fileDescriptor: fd, events: .rename, queue: queue) else {
    close(fd)
    return nil
  }
  // Copy the filename for later use.
  source.context = UnsafeMutableRawPointer(strdup(filename))

  // Install the event handler to process the name change (weakly: the caller owns the source).
  source.setEventHandler { [weak source] in
    guard let source else { return }
    myUpdateFileName(source, fd)
  }

  // Install a cancellation handler to free the descriptor and the stored string.
  source.setCancelHandler { [weak source] in
    if let source {
      print(
        "cancel handler: freeing '\(basename(String(cString: source.context!.assumingMemoryBound(to: CChar.self))))'")
      free(source.context)
      source.context = nil
    }
    close(fd)
    cancelled.signal()
  }

  // Start processing events.
  source.resume()
  return source
}

var template = Array("/tmp/MonitorRename-XXXXXX".utf8CString)
guard mkdtemp(&template) != nil else {
  print("mkdtemp failed")
  exit(1)
}
let directory = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
let original = directory + "/original.txt"
let created = open(original, O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
close(created)
print("watching \(basename(original)) for renames")

guard let source = monitorNameChangesToFile(original) else {
  print("could not monitor \(original)")
  exit(1)
}

var names: [String] = []
for name in ["first-rename.txt", "second-rename.txt"] {
  let from = names.last.map { directory + "/" + $0 } ?? original
  guard rename(from, directory + "/" + name) == 0 else {
    print("rename failed")
    exit(1)
  }
  names.append(name)
  guard renamed.wait(timeout: .seconds(10)) else {
    print("no event for the rename to \(name)")
    exit(1)
  }
  print("source.path now ends with \(name): \(source.path == directory + "/" + name)")
}

source.cancel()
guard cancelled.wait(timeout: .seconds(10)) else {
  print("the cancel handler did not run")
  exit(1)
}
unlink(directory + "/" + names.last!)
rmdir(directory)
print("rename events: \(events.load(ordering: .relaxed))")
exit(events.load(ordering: .relaxed) == 2 ? 0 : 1)
