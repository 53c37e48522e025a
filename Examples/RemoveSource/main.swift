// Reproduces `RemoveDispatchSource(mySource)` ("Canceling a Dispatch Source"): `dispatch_source_cancel`
// then `dispatch_release`; the cancel handler, `close(fd)`, is the last thing the source runs.
//
// On Linux: the same calls; the release is dropping the last reference. Cancel is asynchronous: here a
// read source on a pipe is removed while its handler runs; that handler finishes, no other one starts
// (though data is left to read), and then the cancel handler runs, once.

import GCD
import Glibc

func removeDispatchSource(_ mySource: consuming ReadSource?) {
  mySource?.cancel()
  mySource = nil  // dispatch_release
}

var ends: [Int32] = [-1, -1]
precondition(pipe(&ends) == 0, "pipe failed")
let (fd, writeEnd) = (ends[0], ends[1])
_ = fcntl(fd, F_SETFL, O_NONBLOCK)
let handlerRuns = try! Semaphore(value: 0)
let mayFinish = try! Semaphore(value: 0)
let cancelled = try! Semaphore(value: 0)

var mySource: ReadSource? = try! ReadSource(fileDescriptor: fd, queue: Queue(label: "com.example.Reader"))
mySource!.setEventHandler {
  var byte: UInt8 = 0
  print("event handler: read \(read(fd, &byte, 1)) byte; working")
  handlerRuns.signal()
  mayFinish.wait()
  print("event handler: finished its work")
}
mySource!.setCancelHandler {
  print("cancel handler: close(fd) returned \(close(fd))")
  cancelled.signal()
}
mySource!.resume()

_ = write(writeEnd, "ab", 2)  // two bytes: the handler reads one, so another event is due
handlerRuns.wait()
removeDispatchSource(mySource.take())
print("RemoveDispatchSource returned while the event handler runs")
_ = write(writeEnd, "c", 1)  // more data after the cancel: no handler starts for it
mayFinish.signal()
precondition(cancelled.wait(timeout: .seconds(10)), "the cancel handler did not run in 10 s")
