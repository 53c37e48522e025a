// Reproduces `MonitorNameChangesToFile(filename)` ("Monitoring a File-System Object"): open the file for
// events only, a VNODE source for `DISPATCH_VNODE_RENAME` on the default global queue, a copy of the
// name as the source's context, `MyUpdateFileName` on each rename, and a cancel handler that frees the
// name and closes the descriptor.
//
// On Linux: libdispatch has no vnode source and there is no O_EVTONLY: `FileSystemSource` watches the
// file through inotify, and its `path` is the name after a rename. The program renames the file itself,
// twice (to <file>.1, then <file>.2), each time after the event for the last rename.
//
// Usage: ExampleMonitorRename [file, default /tmp/ExampleMonitorRename.txt, created if missing]

import GCD
import Glibc

let filename = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : "/tmp/ExampleMonitorRename.txt"
let renamed = try! Semaphore(value: 0)
let cancelled = try! Semaphore(value: 0)

/// The file has a new name: replaces the stale copy in the source's context.
func myUpdateFileName(_ oldFilename: String, _ fd: Int32, _ source: FileSystemSource) {
  let newFilename = source.path ?? oldFilename
  print("MyUpdateFileName: \(source.firedEvents) on descriptor \(fd): \(oldFilename) -> \(newFilename)")
  free(source.context)
  source.context = UnsafeMutableRawPointer(strdup(newFilename))
  renamed.signal()
}

func monitorNameChangesToFile(_ filename: String) -> FileSystemSource? {
  let fd = open(filename, O_RDONLY)
  if fd == -1 { return nil }
  guard let source = try? FileSystemSource(fileDescriptor: fd, events: .rename, queue: .global(.default)) else {
    close(fd)
    return nil
  }
  // Copy the filename for later use.
  source.context = UnsafeMutableRawPointer(strdup(filename))
  // Install the event handler to process the name change
  source.setEventHandler {
    let oldFilename = String(cString: source.context!.assumingMemoryBound(to: CChar.self))
    myUpdateFileName(oldFilename, fd, source)
  }
  // Install a cancellation handler to free the descriptor and the stored string.
  source.setCancelHandler {
    let fileStr = source.context!.assumingMemoryBound(to: CChar.self)
    print("cancel handler: free('\(String(cString: fileStr))'), close(fd) returned \(close(fd))")
    free(fileStr)
    cancelled.signal()
  }
  // Start processing events.
  source.resume()
  return source
}

close(open(filename, O_WRONLY | O_CREAT, 0o644))
guard let source = monitorNameChangesToFile(filename) else { fatalError("cannot watch \(filename)") }
for (from, to) in [(filename, filename + ".1"), (filename + ".1", filename + ".2")] {
  print("rename(\(from), \(to))")
  precondition(rename(from, to) == 0, "rename failed: errno \(errno)")
  precondition(renamed.wait(timeout: .seconds(10)), "no event for the rename to \(to) in 10 s")
}
source.cancel()
precondition(cancelled.wait(timeout: .seconds(10)), "the cancel handler did not run in 10 s")
