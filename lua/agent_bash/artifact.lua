-- artifact://<id> (SPEC §4.3): `:edit artifact://<id>` shows an artifact's full text read-only;
-- truncated cards load it on demand. The backend only resolves the id to the file (with the
-- exact errors of SPEC §4.3); Neovim reads the file itself, so up to 32 MiB of text never
-- travels through RPC.

local M = {}
local H = {}

--- Resolves an artifact to its file. Returns true and the path, or false and the exact error
--- text of SPEC §4.3 (e.g. `Artifact 7 not found. Available: 1, 2`).
---@param id integer|string id or full `artifact://<id>` URL
---@return boolean ok
---@return string path_or_err
function M.path(id)
  local url = tostring(id)
  if not url:match('^artifact://') then
    url = 'artifact://' .. url
  end
  local ok, res = require('agent_bash.backend').request('artifact_path', { url = url })
  if ok and type(res) ~= 'string' then
    return false, ('unexpected answer to artifact_path: %s'):format(vim.inspect(res))
  end
  return ok, res
end

--- An artifact's lines, read from its file. Returns true and the lines, or false and the error.
---@param id integer|string id or full `artifact://<id>` URL
---@return boolean ok
---@return string[]|string lines_or_err
function M.lines(id)
  local ok, path = M.path(id)
  if not ok then
    return false, path
  end
  local rok, lines = pcall(vim.fn.readfile, path, 'b')
  if not rok then
    return false, ('could not read %s: %s'):format(path, lines)
  end
  if #lines > 0 and lines[#lines] == '' then
    lines[#lines] = nil -- the final newline makes no extra line
  end
  return true, lines
end

--- Splits text into buffer lines (a final newline does not make an extra empty line).
---@param text string
---@return string[]
function M.split(text)
  local lines = vim.split(text, '\n', { plain = true })
  if #lines > 1 and lines[#lines] == '' then
    lines[#lines] = nil
  end
  return lines
end

--- BufReadCmd handler for artifact://*: fills the buffer read-only from the artifact's file
--- (read by Neovim itself), or reports the error and leaves it empty.
---@param ev {buf: integer, match: string}
function M.read_cmd(ev)
  local buf = ev.buf
  local ok, lines = M.lines(ev.match)
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, ok and lines or {})
  H.options(buf)
  if not ok then
    vim.notify(lines, vim.log.levels.ERROR)
  end
end

-- Helpers -----------------------------------------------------------------------------------

function H.options(buf)
  local bo = vim.bo[buf]
  bo.buftype = 'nofile'
  bo.swapfile = false
  bo.modified = false
  bo.modifiable = false
  bo.readonly = true
  bo.filetype = 'agent_bash_artifact'
end

return M
