-- A small logger: appends lines to stdpath('log')/agent_bash.log (the backend's log file too).
-- Never prints: messages for the user go through vim.notify.

local M = {}
local H = {}

H.levels = { debug = 1, info = 2, warn = 3, error = 4 }

--- The log file shared by the Lua side and the backend.
---@return string
function M.file()
  return vim.fn.stdpath('log') .. '/agent_bash.log'
end

---@param msg string
---@param ... any formatted with string.format
function M.debug(msg, ...)
  H.write('debug', msg, ...)
end

---@param msg string
---@param ... any
function M.info(msg, ...)
  H.write('info', msg, ...)
end

---@param msg string
---@param ... any
function M.warn(msg, ...)
  H.write('warn', msg, ...)
end

---@param msg string
---@param ... any
function M.error(msg, ...)
  H.write('error', msg, ...)
end

-- Helpers -----------------------------------------------------------------------------------

function H.write(level, msg, ...)
  local min = require('agent_bash.config').options.log_level
  if H.levels[level] < (H.levels[min] or 2) then
    return
  end
  if select('#', ...) > 0 then
    msg = msg:format(...)
  end
  local path = M.file()
  vim.fn.mkdir(vim.fn.fnamemodify(path, ':h'), 'p')
  -- 0600: the log holds commands and paths (the backend creates it the same way).
  local fd = vim.uv.fs_open(path, 'a', tonumber('600', 8))
  if not fd then
    return
  end
  vim.uv.fs_write(fd, ('%s [lua] %s %s\n'):format(os.date('%Y-%m-%dT%H:%M:%S'), level:upper(), msg))
  vim.uv.fs_close(fd)
end

--- Tells the user something that happened on its own (a run ended, waits for input): one
--- message cut to the room the command line has ('v:echospace'), so it never stops the editor
--- at a "Press ENTER" prompt. `command` is cut first.
---@param fmt string message with one `%s` for the command
---@param command string
---@param level integer vim.log.levels.*
function M.say(fmt, command, level)
  local room = math.max(20, vim.v.echospace)
  local fixed = vim.fn.strwidth(fmt:format(''))
  local cmd = command:match('^[^\n]*') or ''
  local left = math.max(8, room - fixed)
  if vim.fn.strwidth(cmd) > left then
    cmd = vim.fn.strcharpart(cmd, 0, left - 1) .. '…'
  end
  vim.notify(fmt:format(cmd), level)
end

return M
